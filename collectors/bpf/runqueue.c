/* Run-queue latency: from the moment a task becomes runnable (woken, or preempted while still
 * runnable) to the moment it is switched in.
 *
 * The wakeup runs in the waker's context and sched_switch in the context of the task leaving
 * the CPU, so neither sees the wakee's cgroup. The wait is therefore measured at switch-in,
 * parked, and charged at the task's next switch-out, when the current task is the wakee.
 *
 * These handlers run on every context switch of the machine: one entry per thread holds both
 * timestamps and is updated in place, so the common path is two lookups and the histogram
 * add, without map inserts or deletes (entries of exited threads age out of the LRU map).
 *
 * Who made it wait (rq_blame, the culprit attribution of detector/attribution/): when a waiting
 * task is switched in, the task leaving the CPU ran for part of that wait, from its own
 * switch-in (kept per CPU) or from the start of the wait, whichever is later. That overlap is
 * parked with the wait, under the leaving task's id, and charged to the (waiter, runner) pair
 * at the waiter's switch-out, like the histogram. Only the last runner is charged: a wait
 * spanning several runners is blamed on the one the waiter finally displaced, which under CFS
 * is mostly the task that held the CPU for its slice. One more lookup per charged wait. */
struct rq_key {
    u64 id;
};
struct rq_task {
    u64 since;   /* when it became runnable; 0 while it is not waiting */
    u64 parked;  /* wait measured at switch-in + 1, not charged yet; 0 when none */
    u64 culprit; /* id of the task it displaced at that switch-in */
    u64 blamed;  /* how much of the parked wait that task ran for; 0 when none */
};
struct blame_key {
    u64 victim;
    u64 culprit;
};
struct blame {
    u64 wait_ns;
    u64 count;
};

BPF_TABLE("lru_hash", u32, struct rq_task, rq_tasks, 65536);
HIST_MAP(rq_hist, struct rq_key, 16384);
BPF_F_TABLE("hash", struct blame_key, struct blame, rq_blame, 16384, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(rq_on_cpu, u64, 1); /* when the current task of this CPU was switched in */
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
    int zero = 0;
    u64 prev_on = 0;
    u64 *on_cpu = rq_on_cpu.lookup(&zero);
    if (on_cpu) {
        prev_on = *on_cpu;
        *on_cpu = now;
    }
    if (prev != 0) {
        struct rq_task *task = rq_tasks.lookup(&prev);
        if (task) {
            if (task->parked) {
                struct rq_key key = {.id = CURRENT_ID()};
                rq_hist_add(&key, task->parked - 1);
                task->parked = 0;
                if (task->blamed) {
                    struct blame_key pair = {.victim = key.id, .culprit = task->culprit};
                    struct blame *b = rq_blame.lookup(&pair);
                    if (b) {
                        __sync_fetch_and_add(&b->wait_ns, task->blamed);
                        __sync_fetch_and_add(&b->count, 1);
                    } else {
                        struct blame fresh = {.wait_ns = task->blamed, .count = 1};
                        rq_blame.insert(&pair, &fresh);
                    }
                    task->blamed = 0;
                }
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
            u64 waited = now - task->since;
            task->parked = waited + 1;
            task->blamed = 0;
            /* the idle task displaces nobody; a runner switched in before this CPU was first
             * seen (prev_on 0) ran for an unknown time */
            if (prev != 0 && prev_on) {
                u64 ran = now - prev_on;
                task->culprit = CURRENT_ID();
                task->blamed = ran < waited ? ran : waited;
            }
            task->since = 0;
        }
    }
    return 0;
}
