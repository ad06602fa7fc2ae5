/* Run-queue latency: from the moment a task becomes runnable (woken, or preempted while still
 * runnable) to the moment it is switched in.
 *
 * The wakeup runs in the waker's context and sched_switch in the context of the task leaving
 * the CPU, so neither sees the wakee's cgroup. The wait is therefore measured at switch-in,
 * parked, and charged at the task's next switch-out, when the current task is the wakee. */
struct rq_key {
    u64 id;
    u64 slot;
};

BPF_TABLE("lru_hash", u32, u64, rq_start, 65536);
BPF_TABLE("lru_hash", u32, u64, rq_parked, 65536);
HIST_MAP(rq_hist, struct rq_key, 65536);

static __always_inline void rq_enqueued(u32 pid, u64 now) {
    if (pid != 0)
        rq_start.update(&pid, &now);
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
    if (prev != 0) {
        u64 *parked = rq_parked.lookup(&prev);
        if (parked) {
            u64 wait = *parked;
            rq_parked.delete(&prev);
            struct rq_key key = {.id = CURRENT_ID(), .slot = bpf_log2l(wait)};
            rq_hist.atomic_increment(key);
            key.slot = SLOT_SUM;
            rq_hist.atomic_increment(key, wait);
        }
        /* Still runnable (preempted): its wait starts now. A preempted task reports
         * TASK_REPORT_MAX (0x100) here, so only the low bits tell the state. */
        if ((args->prev_state & 0xff) == 0)
            rq_start.update(&prev, &now);
    }
    if (next != 0) {
        u64 *since = rq_start.lookup(&next);
        if (since) {
            u64 wait = now - *since;
            rq_start.delete(&next);
            rq_parked.update(&next, &wait);
        }
    }
    return 0;
}
