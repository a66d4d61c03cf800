/*
 * perf_loop: random reads through the C API at a fixed queue depth, as `ubdirect perf -w randread`
 * does, to show what the C boundary costs. Each completion callback submits the next read of its
 * buffer (SPDK's style); one thread polls.
 *
 *   perf_loop DDDD:BB:DD.F QUEUE_DEPTH SECONDS [IO_SIZE]
 *
 * Prints "perf_loop: qd Q, io N bytes: I IOPS, B MiB/s" (I/Os completed within SECONDS).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ubdirect.h"

struct loop {
    struct ubd_qpair *qp;
    const struct ubd_ns *ns;
    uint64_t slots;  /* I/O-sized slots in the namespace */
    uint32_t blocks; /* blocks per I/O */
    uint64_t rng;
    uint64_t done;
    int stop;
    int err;
};

struct io {
    struct loop *l;
    struct ubd_buf *buf;
};

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void on_read(void *arg, const struct ubd_completion *cpl);

static int submit(struct io *io)
{
    struct loop *l = io->l;
    uint64_t lba = (next_rand(&l->rng) % l->slots) * l->blocks;
    return ubd_ns_cmd_read(l->ns, l->qp, io->buf, lba, l->blocks, on_read, io, 0);
}

static void on_read(void *arg, const struct ubd_completion *cpl)
{
    struct io *io = arg;
    struct loop *l = io->l;
    if (cpl->status < 0) {
        l->err = cpl->status;
        return;
    }
    l->done++;
    if (!l->stop) {
        int rc = submit(io);
        if (rc < 0)
            l->err = rc;
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "perf_loop: %s: %s: %s\n", what, ubd_strerror(rc), ubd_last_error_message());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DDDD:BB:DD.F QUEUE_DEPTH SECONDS [IO_SIZE]\n", argv[0]);
        return 2;
    }
    uint32_t qd = (uint32_t)strtoul(argv[2], NULL, 0);
    double seconds = strtod(argv[3], NULL);
    size_t io_size = argc > 4 ? strtoul(argv[4], NULL, 0) : 4096;
    if (qd == 0 || qd > 1024 || seconds <= 0 || io_size == 0) {
        fprintf(stderr, "perf_loop: queue depth 1..1024, seconds > 0 and an I/O size are needed\n");
        return 2;
    }
    size_t block = 4096;
    while (block < io_size)
        block <<= 1;

    struct ubd_env_opts opts;
    ubd_env_opts_init(&opts);
    opts.nvme_addrs = (const char *const *)&argv[1];
    opts.nvme_count = 1;
    opts.block_size = block;
    opts.block_count = qd;
    opts.reserve_hugepages = 2;
    struct ubd_env *env = NULL;
    struct ubd_ctrlr *ctrlr = NULL;
    struct ubd_qpair_opts qopts;
    struct loop l = {.rng = 0x9e3779b97f4a7c15ull};
    struct io ios[1024];
    int rc;

    if ((rc = ubd_env_open(&opts, &env)) < 0)
        return fail("opening the environment", rc);
    if ((rc = ubd_ctrlr_open(env, argv[1], &ctrlr)) < 0 || (rc = ubd_ctrlr_get_ns(ctrlr, 0, &l.ns)) < 0)
        return fail("opening the controller", rc);
    ubd_qpair_opts_init(&qopts);
    qopts.depth = qd;
    if ((rc = ubd_qpair_alloc(ctrlr, &qopts, &l.qp)) < 0)
        return fail("a queue pair", rc);
    uint32_t lbs = ubd_ns_get_sector_size(l.ns);
    if (io_size % lbs != 0)
        return fprintf(stderr, "perf_loop: I/O size %zu is not a multiple of %u\n", io_size, lbs), 2;
    l.blocks = (uint32_t)(io_size / lbs);
    l.slots = ubd_ns_get_num_sectors(l.ns) / l.blocks;

    for (uint32_t i = 0; i < qd; i++) {
        ios[i].l = &l;
        if ((rc = ubd_buf_get(env, &ios[i].buf)) < 0)
            return fail("a pool buffer", rc);
    }
    double t0 = now(), end = t0 + seconds;
    for (uint32_t i = 0; i < qd; i++)
        if ((rc = submit(&ios[i])) < 0)
            return fail("submitting", rc);
    /* The clock is read every 64 polls: in a guest it can cost more than a poll. */
    for (unsigned polls = 1; !l.err && ((polls & 63) != 0 || now() < end); polls++)
        if ((rc = ubd_qpair_process_completions(l.qp, 0)) < 0)
            return fail("processing completions", rc);
    uint64_t ios_done = l.done;
    double elapsed = now() - t0;
    l.stop = 1;
    while (ubd_qpair_get_num_outstanding(l.qp) > 0)
        if (ubd_qpair_process_completions(l.qp, 0) < 0)
            break;
    if (l.err)
        return fail("a read", l.err);

    double iops = (double)ios_done / elapsed;
    printf("perf_loop: qd %u, io %zu bytes: %.0f IOPS, %.1f MiB/s\n", qd, io_size, iops,
           iops * (double)io_size / (1 << 20));
    for (uint32_t i = 0; i < qd; i++)
        ubd_buf_put(ios[i].buf);
    ubd_qpair_free(&l.qp);
    ubd_ctrlr_close(&ctrlr);
    ubd_env_close(&env);
    return 0;
}
