/* Run-queue latency: from the moment a task becomes runnable (woken, or preempted while still
 * runnable) to the moment it is switched in.
 *
 * The wakeup runs in the waker's context and sched_switch in the context of the task leaving
 * the CPU, so neither sees the wakee's cgroup. The wait is therefore measured at switch-in,
 * parked, and charged at the task's next switch-out, when the current task is the wakee.
 *
 * These handlers run on every context switch of the machine: one entry per thread holds both
 * timestamps and is updated in place, so the common path is two lookups and the histogram
 * add, without map inserts or deletes (entries of exited threads age out of the LRU map). */
struct rq_key {
    u64 id;
};
struct rq_task {
    u64 since;   /* when it became runnable; 0 while it is not waiting */
    u64 parked;  /* wait measured at switch-in + 1, not charged yet; 0 when none */
};

BPF_TABLE("lru_hash", u32, struct rq_task, rq_tasks, 65536);
HIST_MAP(rq_hist, struct rq_key, 16384);
HIST_FUNCTIONS

/* A wakeup also fires for a task that is still on a CPU or already waiting on a run queue
 * (ttwu_runnable): an existing `since` is kept, so such a wakeup neither starts a wait nor cuts
 * one short. */
static __always_inline void rq_enqueued(u32 pid, u64 now) {
    if (pid == 0)
        return;
    struct rq_task *task = rq_tasks.lookup(&pid);
    if (task) {
        if (task->since == 0)
            task->since = now;
    } else {
        struct rq_task fresh = {.since = now};
        rq_tasks.update(&pid, &fresh);
    }
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    rq_enqueued(args->pid, bpf_ktime_get_ns());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    rq_enqueued(args->pid, bpf_ktime_get_ns());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid, next = args->next_pid;
    /* Still runnable (preempted): its wait starts now. A preempted task reports
     * TASK_REPORT_MAX (0x100) here, so only the low bits tell the state. */
    int runnable = (args->prev_state & 0xff) == 0;
    if (prev != 0) {
        struct rq_task *task = rq_tasks.lookup(&prev);
        if (task) {
            if (task->parked) {
                struct rq_key key = {.id = CURRENT_ID()};
                rq_hist_add(&key, task->parked - 1);
                task->parked = 0;
            }
            /* Leaving the CPU settles `since`: waiting from now if still runnable, else not
             * waiting (this also drops a `since` set by a wakeup while it was running). */
            task->since = runnable ? now : 0;
        } else if (runnable) {
            rq_enqueued(prev, now);
        }
    }
    if (next != 0) {
        struct rq_task *task = rq_tasks.lookup(&next);
        if (task && task->since) {
            task->parked = now - task->since + 1;
            task->since = 0;
        }
    }
    return 0;
}
