"""The wire: message types (``messages``), their encoding (``codec``) and sockets (``sockets``).

Every link in the system, in one place. Each server binds one ROUTER and every peer connects a
DEALER, so a server can answer each peer by its identity, hold a reply back (flow control) and
drop replies to peers that have gone away.

+--------+-----------------------+-----------------+---------------+-------------------------------+
| link   | binds                 | connects        | pattern       | messages in -> out            |
+========+=======================+=================+===============+===============================+
| replay | replay server ROUTER  | actors DEALER,  | ROUTER/DEALER | TrajectoryChunk -> InsertAck  |
|        | (cfg.net.replay_addr) | learners DEALER |               |   (delayed while the rate     |
|        |                       |                 |               |   limiter holds inserts: flow |
|        |                       |                 |               |   control, one chunk in       |
|        |                       |                 |               |   flight per actor)           |
|        |                       |                 |               | ActorReport -> (none)         |
|        |                       |                 |               | SampleRequest -> SampleBatch  |
|        |                       |                 |               |   (delayed until sampling is  |
|        |                       |                 |               |   allowed)                    |
|        |                       |                 |               | PriorityUpdate -> (none)      |
|        |                       |                 |               | StatsRequest -> Stats         |
|        |                       |                 |               | Shutdown -> (server stops;    |
|        |                       |                 |               |   later requests get          |
|        |                       |                 |               |   Shutdown)                   |
|        |                       |                 |               | malformed -> Error            |
+--------+-----------------------+-----------------+---------------+-------------------------------+
| params | param server ROUTER   | learner DEALER, | ROUTER/DEALER | PublishParams -> PublishAck   |
|        | (cfg.net.params_addr) | actors DEALER   |               | ParamsRequest -> Params or    |
|        |                       |                 |               |   ParamsNotModified           |
|        |                       |                 |               | StatsRequest -> Stats         |
|        |                       |                 |               | Shutdown -> (server stops)    |
|        |                       |                 |               | malformed -> Error            |
+--------+-----------------------+-----------------+---------------+-------------------------------+
100

In a multi-agent run (``apexrl.multiagent``) a chunk, a sample request and a priority update name
their policy's table, and ``ParamsRequest``, ``PublishParams`` and ``PublishedVersion`` the policy
whose weights they are; each actor connects one params DEALER per network policy.

Servers use ``sockets.bind`` with ``sockets.recv_from`` / ``sockets.send_to``; peers use
``sockets.connect`` with ``sockets.send`` / ``sockets.recv``. A bad request never stops a server:
the codec raises ``DecodeError``, ``recv_from`` hands it back with the sender's identity, and the
server answers ``Error``.

This package imports nothing by itself: import the submodule you need.
"""
