#!/bin/bash
# @sbatch@

# @about@
# @values@

APEXRL=("$PYTHON" -m apexrl)
LOGS=$RUN_DIR/logs
mkdir -p "$LOGS"
STOPPING=$RUN_DIR/.slurm-$SLURM_JOB_ID.stopping  # exists once the run is ending
rm -f "$STOPPING"

log() { printf '%s apexrl-slurm job %s: %s\n' "$(date '+%F %T')" "$SLURM_JOB_ID" "$*"; }

# --- placement: the head node runs the servers and learners, the actor nodes the actors ---------
if [ "$HET" = 1 ]; then
    SERVER_NODELIST=$SLURM_JOB_NODELIST_HET_GROUP_0
    ACTOR_NODELIST=$SLURM_JOB_NODELIST_HET_GROUP_1
else
    SERVER_NODELIST=$SLURM_JOB_NODELIST
    ACTOR_NODELIST=$SLURM_JOB_NODELIST
fi
mapfile -t ACTOR_NODES < <(scontrol show hostnames "$ACTOR_NODELIST")
HEAD=$(scontrol show hostnames "$SERVER_NODELIST" | head -n 1)
if [ -z "$HEAD" ] || [ "${#ACTOR_NODES[@]}" = 0 ]; then
    log "cannot read the job's nodes (SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST)"
    exit 1
fi

# The head's address: the NodeAddr SLURM reaches it at, as an IP the servers can bind.
node_ip() {
    local addr
    addr=$(scontrol show node "$1" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1)
    addr=${addr:-$1}
    if [[ $addr =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
        echo "$addr"
    else
        getent ahostsv4 "$addr" | awk 'NR == 1 {print $1}'
    fi
}
HEAD_IP=$(node_ip "$HEAD")
if [ -z "$HEAD_IP" ]; then
    log "cannot find the address of the head node $HEAD"
    exit 1
fi
PORT_BASE=${PORT_BASE:-$((20000 + SLURM_JOB_ID % 4000 * 10))}
REPLAY=tcp://$HEAD_IP:$PORT_BASE
PARAMS=tcp://$HEAD_IP:$((PORT_BASE + 1))
RENDEZVOUS=tcp://$HEAD_IP:$((PORT_BASE + 2))
COMMON=(--config "$CONFIG" --run-dir "$RUN_DIR")
# Each role gets only its own bundle of the run's keys (`apexrl keys`): servers, learner, its
# own actor key (or the actors' shared one) or eval. The run's config.yaml names the whole directory, for apexrl status and stop.
CLIENT=(--replay "$REPLAY" --params "$PARAMS")
# A resumed run: the learner continues from its checkpoint, the actors wait for its weights.
if [ "$RESUME" = 1 ]; then CLIENT+=(--resume); fi

# `step NAME NODE GROUP [srun options] -- apexrl arguments`: one role as a job step on NODE.
step() {
    local name=$1 node=$2 group=$3
    shift 3
    local options=(--nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=1
        --job-name="$name" --output="$LOGS/$name.out" --open-mode=append)
    if [ "$HET" = 1 ]; then options+=(--het-group="$group"); fi
    while [ "$1" != -- ]; do options+=("$1"); shift; done
    shift
    srun "${options[@]}" "${APEXRL[@]}" "$@"
}

# An actor's step, started again when it dies (not after a configuration error, exit 2).
actor_loop() {
    local name=$1 node=$2
    shift 2
    local restarts=0 delay=2 code
    while :; do
        step "$name" "$node" 1 --overlap -- actor "${COMMON[@]}" "${CLIENT[@]}" "$@"
        code=$?
        if [ "$code" = 0 ] || [ -e "$STOPPING" ]; then return "$code"; fi
        if [ "$code" = 2 ]; then
            log "$name: configuration error (exit 2), not restarted; see $LOGS/$name.log"
            return 2
        fi
        if [ "$restarts" -ge "$MAX_ACTOR_RESTARTS" ]; then
            log "$name ended with exit code $code after $restarts restarts; not restarting it"
            return "$code"
        fi
        restarts=$((restarts + 1))
        log "$name ended with exit code $code on $node;" \
            "restart $restarts of $MAX_ACTOR_RESTARTS in $delay s"
        sleep "$delay"
        if [ -e "$STOPPING" ]; then return "$code"; fi
        delay=$((delay * 2 > 60 ? 60 : delay * 2))
    done
}

declare -A ROLE_PID IS_ACTOR  # the subshell of each step (actors: their restart loop)
log "head node $HEAD ($HEAD_IP): replay $REPLAY, params $PARAMS, $NUM_LEARNERS learner(s);" \
    "actor nodes: ${ACTOR_NODES[*]}; run directory $RUN_DIR"
log "status: apexrl status $RUN_DIR; stop: apexrl stop --run-dir $RUN_DIR (or scancel)"

step replay "$HEAD" 0 --overlap -- replay "${COMMON[@]}" --keys "$KEYS/servers" --bind "$REPLAY" &
ROLE_PID[replay]=$!
step params "$HEAD" 0 --overlap -- params "${COMMON[@]}" --keys "$KEYS/servers" --bind "$PARAMS" &
ROLE_PID[params]=$!
# Servers and actors overlap every step; a learner with GPUs holds its own (--gpus-per-task).
if [ "$GPUS_PER_LEARNER" -gt 0 ]; then
    LEARNER_RESOURCES=(--gpus-per-task="$GPUS_PER_LEARNER")
else
    LEARNER_RESOURCES=(--overlap)
fi
for ((rank = 0; rank < NUM_LEARNERS; rank++)); do
    if [ "$NUM_LEARNERS" = 1 ]; then name=learner; else name=learner_$rank; fi
    step "$name" "$HEAD" 0 "${LEARNER_RESOURCES[@]}" -- learner "${COMMON[@]}" "${CLIENT[@]}" \
        --keys "$KEYS/learner" --rank "$rank" --world-size "$NUM_LEARNERS" \
        --rendezvous "$RENDEZVOUS" &
    ROLE_PID[$name]=$!
done
for ((i = 0; i < NUM_ACTORS; i++)); do
    node=${ACTOR_NODES[$((i % ${#ACTOR_NODES[@]}))]}
    bundle="$KEYS/actor_$i"  # its own key; keys made without --actors: the shared one
    [ -d "$bundle" ] || bundle="$KEYS/actors"
    actor_loop "actor_$i" "$node" --keys "$bundle" --id "$i" --num-actors "$NUM_ACTORS" &
    ROLE_PID[actor_$i]=$!
    IS_ACTOR[actor_$i]=1
done
if [ "$EVAL" = 1 ]; then
    actor_loop eval "${ACTOR_NODES[0]}" --keys "$KEYS/eval" --eval &
    ROLE_PID[eval]=$!
    IS_ACTOR[eval]=1
fi
log "started replay, params, $NUM_LEARNERS learner(s) and $NUM_ACTORS actors (evaluation: $EVAL)"

# scancel or the time limit: SLURM sends SIGTERM to every step, and to this script.
trap 'touch "$STOPPING"; log "SIGTERM: the job is being cancelled; the roles are stopping"' TERM

# SIGTERM to the tasks of every step (not to this script): each role stops as on Ctrl-C, the
# learner with its checkpoint. (A signal to srun itself would have SLURM kill the step at once.)
stop_rest() {
    scancel --signal=TERM "$SLURM_JOB_ID"
}

# --- watch the steps until every one has ended ----------------------------------------------------
status=0
stop_deadline=
while [ "${#ROLE_PID[@]}" -gt 0 ]; do
    for name in "${!ROLE_PID[@]}"; do
        pid=${ROLE_PID[$name]}
        kill -0 "$pid" 2>/dev/null && continue
        wait "$pid"
        code=$?
        unset "ROLE_PID[$name]"
        if [ "$code" != 0 ] && [ ! -e "$STOPPING" ]; then
            # A server or learner that failed, or an actor that kept dying.
            log "the $name step ended with exit code $code: ending the job." \
                "Last lines of $LOGS/$name.log:"
            tail -n 20 "$LOGS/$name.log" 2>/dev/null | sed 's/^/    /'
            status=1
            touch "$STOPPING"
            stop_rest
        else
            log "the $name step ended with exit code $code"
            # The learner's stop condition or `apexrl stop`: the servers are shutting down.
            if [ -z "${IS_ACTOR[$name]:-}" ]; then touch "$STOPPING"; fi
        fi
    done
    if [ -e "$STOPPING" ]; then
        if [ -z "$stop_deadline" ]; then stop_deadline=$((SECONDS + STOP_GRACE_S)); fi
        if [ "$SECONDS" -ge "$stop_deadline" ]; then
            log "steps still running ${STOP_GRACE_S} s after the run began to end: SIGTERM to them"
            stop_rest
            stop_deadline=$((SECONDS + 3600))
        fi
    fi
    sleep 1
done
rm -f "$STOPPING"
log "every step has ended; the job exits with status $status"
exit "$status"
