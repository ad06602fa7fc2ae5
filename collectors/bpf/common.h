/* Shared by every sloguard BPF program (prepended by collectors/ebpf_programs.py).
 *
 * Only tracepoint arguments (their layout comes from the running kernel's tracefs format files)
 * and BPF helpers are used: no kernel struct is read, because this project compiles against a
 * stand-in header tree whose struct layouts would not match the running kernel anyway.
 *
 * Every latency is recorded into a log2 histogram keyed by the id of the task that suffered
 * it: its cgroup v2 id (bpf_get_current_cgroup_id), or in pid mode (cgroup v1 hosts, where the
 * v2 id says nothing) its process id, which user space maps to a cgroup via /proc/PID/cgroup.
 * Slot s >= 1 counts values in [2^(s-1), 2^s) ns (slot 1 also holds 0, the last slot
 * everything above); `sum` adds the values themselves, so the mean is exact even though
 * percentiles are not. One map entry per key holds the whole histogram, so an event costs one
 * lookup and two atomic adds, not a lookup per slot.
 */
#define HIST_SLOTS 64

struct hist {
    u64 slots[HIST_SLOTS];
    u64 sum;
};

#ifdef SLOGUARD_KEY_TGID
#define CURRENT_ID() (bpf_get_current_pid_tgid() >> 32)
#else
#define CURRENT_ID() bpf_get_current_cgroup_id()
#endif

/* A new key's histogram is copied from this all-zero entry: a struct hist does not fit on the
 * 512-byte BPF stack. */
BPF_ARRAY(hist_zero, struct hist, 1);

/* Histogram maps are read and cleared by user space every interval, racing with updates:
 * without preallocation a deleted element is freed only after an RCU grace period, so an
 * increment that raced with the delete lands in dead memory instead of in another key. */
#define HIST_MAP(name, key_type, entries) \
    BPF_F_TABLE("hash", key_type, struct hist, name, entries, BPF_F_NO_PREALLOC)
