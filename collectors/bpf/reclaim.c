/* Memory stalls of the allocating task: global direct reclaim, reclaim forced by the cgroup's
 * own memory limit (memcg reclaim), and direct compaction. All run in the context of the task
 * that allocates, so the current cgroup is the one that stalls.
 *
 * Compaction's begin/end events also fire in kcompactd and for proactive compaction; only
 * passes of a task that entered direct compaction (mm_compaction_try_to_compact_pages) are
 * counted, one sample per zone pass. */
struct rc_task {
    u32 tid;
    u32 kind;  /* 0 direct reclaim, 1 memcg reclaim, 2 direct compaction */
};
struct rc_key {
    u64 id;
    u64 kind;
};

BPF_TABLE("lru_hash", struct rc_task, u64, rc_start, 16384);
BPF_TABLE("lru_hash", u32, u8, rc_direct_compact, 16384);
HIST_MAP(rc_hist, struct rc_key, 16384);
HIST_FUNCTIONS

static __always_inline void rc_begin(u32 kind) {
    struct rc_task task = {.tid = (u32)bpf_get_current_pid_tgid(), .kind = kind};
    u64 now = bpf_ktime_get_ns();
    rc_start.update(&task, &now);
}

static __always_inline void rc_end(u32 kind) {
    struct rc_task task = {.tid = (u32)bpf_get_current_pid_tgid(), .kind = kind};
    u64 *since = rc_start.lookup(&task);
    if (!since)
        return;
    u64 delta = bpf_ktime_get_ns() - *since;
    rc_start.delete(&task);
    struct rc_key key = {.id = CURRENT_ID(), .kind = kind};
    rc_hist_add(&key, delta);
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { rc_begin(0); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { rc_end(0); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { rc_begin(1); return 0; }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { rc_end(1); return 0; }

TRACEPOINT_PROBE(compaction, mm_compaction_try_to_compact_pages) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u8 one = 1;
    rc_direct_compact.update(&tid, &one);
    return 0;
}

TRACEPOINT_PROBE(compaction, mm_compaction_begin) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (rc_direct_compact.lookup(&tid))
        rc_begin(2);
    return 0;
}

TRACEPOINT_PROBE(compaction, mm_compaction_end) { rc_end(2); return 0; }
