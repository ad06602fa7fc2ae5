/* Block I/O latency per issuing cgroup, device and operation: from block_io_start (accounting
 * start of a request, in the submitter's context, kernel >= 6.5; older kernels use
 * block_rq_insert, which also mostly runs in the submitter's context) to block_rq_complete
 * (interrupt context), matched by (device, sector). */
struct io_req {
    u32 dev;
    u32 pad;
    u64 sector;
};
struct io_start_val {
    u64 ts;
    u64 id;
};
struct io_key {
    u64 id;
    u32 dev;
    u32 op;  /* 0 read, 1 write, 2 discard, 3 other (flush) */
};

BPF_TABLE("lru_hash", struct io_req, struct io_start_val, io_start, 65536);
HIST_MAP(io_hist, struct io_key, 16384);
HIST_FUNCTIONS

TRACEPOINT_PROBE(block, BLOCK_START_EVENT) {
    struct io_req req = {.dev = args->dev, .sector = args->sector};
    struct io_start_val val = {.ts = bpf_ktime_get_ns(), .id = CURRENT_ID()};
    io_start.update(&req, &val);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete) {
    struct io_req req = {.dev = args->dev, .sector = args->sector};
    struct io_start_val *start = io_start.lookup(&req);
    if (!start)
        return 0;
    u64 delta = bpf_ktime_get_ns() - start->ts;
    u32 op = 3;
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        char c = args->rwbs[i];
        if (c == 'R') { op = 0; break; }
        if (c == 'W') { op = 1; break; }
        if (c == 'D') { op = 2; break; }
        if (c == 0) break;
    }
    struct io_key key = {.id = start->id, .dev = args->dev, .op = op};
    io_start.delete(&req);
    io_hist_add(&key, delta);
    return 0;
}
