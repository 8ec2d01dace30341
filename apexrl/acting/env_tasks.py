"""Env tasks (``Trainer.set_env_task``; RLlib's ``TaskSettableEnv`` convention): the learner sends
the task in force with every weights version (``Params.env_task``, JSON text) and a training
actor, when it differs from the one its envs have, calls ``set_task(task)`` on each of them
(through wrappers: gymnasium's ``VectorEnv.call``). An env without ``set_task``, or one whose
``set_task`` raises, is logged as an error once per task and keeps playing as it was;
``Trainer.set_env_task`` checks for the method before it sends anything."""

from __future__ import annotations

import json
import logging

log = logging.getLogger("apexrl.actor")


class EnvTasks:
    """The task this actor's envs were given, and the call that gives them a new one."""

    def __init__(self, envs, role: str) -> None:
        self.envs, self.role = envs, role
        self.in_force = ""  # JSON text of the task the envs were given; "": none yet

    def apply(self, env_task: str) -> None:
        """Give every env ``env_task`` (JSON text, as the weights brought it) if it is new."""
        if not env_task or env_task == self.in_force:
            return
        self.in_force = env_task
        task = json.loads(env_task)  # checked on decode (messages.check_env_task)
        try:
            self.envs.call("set_task", task)
        except Exception as exc:  # the user's env: say what failed, keep the actor playing
            log.error(
                "%s: cannot set the env task %s: %s: %s (an env takes tasks with a "
                "set_task(task) method)",
                self.role,
                env_task[:200],
                type(exc).__name__,
                exc,
            )
            return
        log.info("%s: env task %s set on %d envs", self.role, env_task[:200], self.envs.num_envs)
