/* HIST_ADD_FN(KEY_TYPE *key, u64 ns): count one latency in HIST_MAP. Instantiated for each
 * family's map by collectors/ebpf_programs.py (BCC does not allow map calls inside macros). */
static __always_inline void HIST_ADD_FN(KEY_TYPE *key, u64 ns) {
    struct hist *h = HIST_MAP_NAME.lookup(key);
    if (!h) {
        int zero_key = 0;
        struct hist *zero = hist_zero.lookup(&zero_key);
        if (!zero)
            return;
        HIST_MAP_NAME.insert(key, zero);
        h = HIST_MAP_NAME.lookup(key);
        if (!h)
            return;
    }
    u32 slot = bpf_log2l(ns);
    if (slot >= HIST_SLOTS)
        slot = HIST_SLOTS - 1;
    __sync_fetch_and_add(&h->slots[slot], 1);
    __sync_fetch_and_add(&h->sum, ns);
}
