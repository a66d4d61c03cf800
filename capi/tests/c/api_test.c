/*
 * The C API from C: write, read back byte-exact, a refused submit leaving its buffer with the
 * caller, write zeroes / flush / deallocate, the pipeline in one call, a missing PCI device
 * giving -ENODEV with a clear message, NULL arguments giving -EINVAL. Prints one line per check and
 * "api_test: N passed, N failed"; exits 0 only when every check passed.
 *
 * Built with -DUBD_TEST_MODEL it runs against the in-process NVMe device model
 * (capi/tests/c_program.rs); otherwise against the controller at the PCI address given as its
 * first argument, bound to vfio-pci, with a hugepage pool:
 *
 *   api_test DDDD:BB:DD.F [LBA]
 *
 * It writes, zeroes and deallocates the 16 blocks from LBA (default 16; -N: N blocks before
 * the end) of the first namespace: give scratch blocks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ubdirect.h"

static int passed, failed;

static void check(int ok, const char *what)
{
    if (ok) {
        passed++;
        printf("ok - %s\n", what);
    } else {
        failed++;
        printf("FAILED - %s (last error: %s)\n", what, ubd_last_error_message());
    }
}

struct waiter {
    int done;
    int status;
    uint64_t bytes;
    struct ubd_buf *buf;
};

static void on_done(void *arg, const struct ubd_completion *cpl)
{
    struct waiter *w = arg;
    w->done = 1;
    w->status = cpl->status;
    w->bytes = cpl->bytes;
    w->buf = cpl->buf;
}

/* Process completions until `w` is done; 0, or -ETIMEDOUT after 5 s. */
static int wait_for(struct ubd_qpair *qp, struct waiter *w)
{
    time_t end = time(NULL) + 5;
    while (!w->done) {
        int rc = ubd_qpair_process_completions(qp, 0);
        if (rc < 0)
            return rc;
        if (time(NULL) > end)
            return -ETIMEDOUT;
    }
    return 0;
}

static int open_env(int argc, char **argv, struct ubd_env **env, const char **addr, long long *base)
{
    struct ubd_env_opts opts;
    ubd_env_opts_init(&opts);
    opts.block_size = 2u << 20;
    opts.block_count = 4;
#ifdef UBD_TEST_MODEL
    (void)argc;
    (void)argv;
    *base = 16;
    *addr = "0000:7f:00.0";
    opts.block_size = 64u << 10;
    return ubd_env_open_model_for_tests(&opts, env);
#else
    if (argc < 2) {
        fprintf(stderr, "usage: %s DDDD:BB:DD.F [LBA] (an NVMe controller bound to vfio-pci; 16 scratch blocks from LBA)\n",
                argv[0]);
        exit(2);
    }
    *addr = argv[1];
    *base = argc > 2 ? strtoll(argv[2], NULL, 0) : 16;
    opts.nvme_addrs = (const char *const *)&argv[1];
    opts.nvme_count = 1;
    opts.reserve_hugepages = 8;
    return ubd_env_open(&opts, env);
#endif
}

int main(int argc, char **argv)
{
    struct ubd_env *env = NULL;
    struct ubd_ctrlr *ctrlr = NULL, *missing = NULL;
    struct ubd_qpair *qp = NULL;
    const struct ubd_ns *ns = NULL;
    struct ubd_buf *buf = NULL;
    const char *addr = NULL;
    long long at = 16;
    struct waiter w;
    int rc;

    rc = open_env(argc, argv, &env, &addr, &at);
    check(rc == 0, "open the environment");
    if (rc != 0) {
        printf("api_test: %d passed, %d failed\n", passed, failed);
        return 1;
    }
    check(ubd_ctrlr_open(env, addr, &ctrlr) == 0, "open the controller by PCI address");
    check(ubd_ctrlr_get_ns(ctrlr, 0, &ns) == 0, "the first active namespace");
    check(ubd_qpair_alloc(ctrlr, NULL, &qp) == 0, "a queue pair");
    check(ubd_buf_get(env, &buf) == 0, "a pool buffer");
    if (!ns || !qp || !buf) {
        printf("api_test: %d passed, %d failed\n", passed, failed);
        return 1;
    }

    uint64_t base = at >= 0 ? (uint64_t)at : ubd_ns_get_num_sectors(ns) - (uint64_t)(-at);
    printf("# scratch blocks %llu..%llu\n", (unsigned long long)base, (unsigned long long)base + 15);
    uint32_t bs = ubd_ns_get_sector_size(ns);
    uint32_t nblocks = 8;
    size_t len = (size_t)bs * nblocks;
    unsigned char *data = ubd_buf_data(buf);
    unsigned char *want = malloc(len);
    for (size_t i = 0; i < len; i++)
        want[i] = data[i] = (unsigned char)((i * 7 + 3) ^ 0xa5);

    /* Write, then read back byte-exact. */
    memset(&w, 0, sizeof w);
    rc = ubd_ns_cmd_write(ns, qp, buf, base, nblocks, on_done, &w, UBD_IO_FLAGS_FUA);
    check(rc == 0, "a write is queued");
    check(ubd_buf_put(buf) == -EBUSY, "a buffer lent to a command cannot be put");
    check(wait_for(qp, &w) == 0 && w.status == 0 && w.bytes == len && w.buf == buf,
          "the write completes through its callback with its buffer");
    memset(data, 0, len);
    memset(&w, 0, sizeof w);
    check(ubd_ns_cmd_read(ns, qp, buf, base, nblocks, on_done, &w, 0) == 0, "a read is queued");
    check(wait_for(qp, &w) == 0 && w.status == 0 && w.buf == buf, "the read completes");
    check(memcmp(data, want, len) == 0, "the read gives back the written bytes exactly");

    /* A refused submit: past the namespace's end. The buffer stays the caller's, untouched. */
    memset(data, 0x3c, len);
    memset(&w, 0, sizeof w);
    uint64_t last_lba = ubd_ns_get_num_sectors(ns) - 1;
    rc = ubd_ns_cmd_read(ns, qp, buf, last_lba, nblocks, on_done, &w, 0);
    check(rc == -ERANGE, "a read past the end is refused with -ERANGE");
    check(strstr(ubd_last_error_message(), "LBA") != NULL || strlen(ubd_last_error_message()) > 10,
          "the refusal has a message");
    check(ubd_qpair_process_completions(qp, 0) == 0 && !w.done, "a refused submit is never called back");
    int untouched = 1;
    for (size_t i = 0; i < len; i++)
        untouched &= data[i] == 0x3c;
    check(untouched, "the refused buffer is untouched");
    memset(&w, 0, sizeof w);
    check(ubd_ns_cmd_read(ns, qp, buf, base, nblocks, on_done, &w, 0) == 0 && wait_for(qp, &w) == 0 &&
              memcmp(data, want, len) == 0,
          "the refused buffer is submitted again and read into");

    /* Write zeroes, flush, deallocate. */
    memset(&w, 0, sizeof w);
    check(ubd_ns_cmd_write_zeroes(ns, qp, base, 1, on_done, &w, 0) == 0 && wait_for(qp, &w) == 0 &&
              w.status == 0 && w.buf == NULL,
          "write zeroes completes without a buffer");
    memset(&w, 0, sizeof w);
    check(ubd_ns_cmd_read(ns, qp, buf, base, nblocks, on_done, &w, 0) == 0 && wait_for(qp, &w) == 0,
          "read after write zeroes");
    int zeroed = 1;
    for (size_t i = 0; i < bs; i++)
        zeroed &= data[i] == 0;
    check(zeroed && memcmp(data + bs, want + bs, len - bs) == 0, "one block zeroed, the rest kept");
    memset(&w, 0, sizeof w);
    check(ubd_ns_cmd_flush(ns, qp, on_done, &w) == 0 && wait_for(qp, &w) == 0 && w.status == 0,
          "flush completes");
    memset(&w, 0, sizeof w);
    rc = ubd_ns_cmd_deallocate(ns, qp, base + 8, 8, on_done, &w);
    check(rc == 0 && wait_for(qp, &w) == 0 && w.status == 0, "deallocate completes");

    /* The pipeline in one call: the namespace's first bytes through pool buffers, verified. */
    struct ubd_pipeline_opts popts;
    struct ubd_pipeline_report rep;
    ubd_pipeline_opts_init(&popts);
    popts.block_size = 16u << 10; /* within the model's per-request limit */
    popts.qd = 2;
    popts.bytes = 8 * (uint64_t)popts.block_size;
    popts.verify = 1;
    memset(&rep, 0, sizeof rep);
    rc = ubd_pipeline_run(env, ctrlr, &popts, &rep);
    check(rc == 0 && rep.bytes == popts.bytes && rep.verified == 1, "the pipeline streams and verifies");
    printf("# pipeline: %llu bytes in %.6f s, %.3f GB/s\n", (unsigned long long)rep.bytes, rep.seconds,
           rep.gb_per_s);
    popts.qd = 0;
    check(ubd_pipeline_run(env, ctrlr, &popts, &rep) == -EINVAL, "a pipeline of qd 0 gives -EINVAL");

    /* A PCI address with no device, and a malformed one. */
    rc = ubd_ctrlr_open(env, "0000:ff:1f.7", &missing);
    check(rc == -ENODEV && missing == NULL, "a missing PCI device gives -ENODEV");
    check(strstr(ubd_last_error_message(), "no PCI device 0000:ff:1f.7") != NULL,
          "and a message naming it");
    printf("# %s: %s\n", ubd_strerror(rc), ubd_last_error_message());
    check(ubd_ctrlr_open(env, "nonsense", &missing) == -EINVAL, "a malformed address gives -EINVAL");

    /* NULL arguments. */
    check(ubd_ns_cmd_read(ns, qp, NULL, 0, 1, on_done, &w, 0) == -EINVAL, "a NULL buffer gives -EINVAL");
    check(strcmp(ubd_last_error_message(), "buf is NULL") == 0, "and says which argument");
    check(ubd_ns_cmd_read(NULL, qp, buf, 0, 1, on_done, &w, 0) == -EINVAL, "a NULL namespace gives -EINVAL");
    check(ubd_buf_get(NULL, &buf) == -EINVAL, "a NULL environment gives -EINVAL");
    check(ubd_qpair_process_completions(NULL, 0) == -EINVAL, "a NULL queue pair gives -EINVAL");

    /* Close: buffer, queue pair, controller, environment; closing twice does nothing. */
    check(ubd_buf_put(buf) == 0, "the buffer goes back to the pool");
    ubd_qpair_free(&qp);
    ubd_qpair_free(&qp);
    ubd_ctrlr_close(&ctrlr);
    ubd_ctrlr_close(&ctrlr);
    ubd_env_close(&env);
    ubd_env_close(&env);
    check(qp == NULL && ctrlr == NULL && env == NULL, "close sets the handles to NULL");
    free(want);

    printf("api_test: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
