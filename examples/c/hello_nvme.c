/*
 * hello_nvme: the first steps with libubdirect from C. Opens the NVMe controller at the PCI
 * address given (bound to vfio-pci: scripts/setup.sh), writes a greeting to LBA 0 of its first
 * namespace, reads it back and prints it.
 *
 *   make -C examples/c && sudo examples/c/hello_nvme 0000:00:04.0
 *
 * Every call returns 0 or a negative errno; ubd_last_error_message() says what went wrong.
 */
#include <stdio.h>
#include <string.h>

#include "ubdirect.h"

/* Set by the completion callback. */
struct io {
    int done;
    int status;
};

static void io_done(void *cb_arg, const struct ubd_completion *cpl)
{
    struct io *io = cb_arg;
    io->status = cpl->status;
    io->done = 1;
}

/* Poll the queue pair until `io` completes (a real engine polls many commands at once). */
static int wait_io(struct ubd_qpair *qp, struct io *io)
{
    while (!io->done) {
        int rc = ubd_qpair_process_completions(qp, 0);
        if (rc < 0)
            return rc;
    }
    return io->status;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "hello_nvme: %s: %s: %s\n", what, ubd_strerror(rc), ubd_last_error_message());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DDDD:BB:DD.F (an NVMe controller bound to vfio-pci)\n", argv[0]);
        return 2;
    }
    struct ubd_env_opts opts;
    ubd_env_opts_init(&opts);
    opts.nvme_addrs = (const char *const *)&argv[1];
    opts.nvme_count = 1;
    opts.block_count = 4;      /* 4 buffers of 2 MiB */
    opts.reserve_hugepages = 4; /* needs root; 0 only checks the free hugepages */

    struct ubd_env *env = NULL;
    struct ubd_ctrlr *ctrlr = NULL;
    struct ubd_qpair *qp = NULL;
    const struct ubd_ns *ns = NULL;
    struct ubd_buf *buf = NULL;
    struct io io = {0};
    int rc, ret = 1;

    if ((rc = ubd_env_open(&opts, &env)) < 0)
        return fail("opening the environment", rc);
    if ((rc = ubd_ctrlr_open(env, argv[1], &ctrlr)) < 0) {
        fail("opening the controller", rc);
        goto out;
    }
    if ((rc = ubd_ctrlr_get_ns(ctrlr, 0, &ns)) < 0 || (rc = ubd_qpair_alloc(ctrlr, NULL, &qp)) < 0 ||
        (rc = ubd_buf_get(env, &buf)) < 0) {
        fail("namespace, queue pair or buffer", rc);
        goto out;
    }
    printf("namespace %u: %llu blocks of %u bytes\n", ubd_ns_get_id(ns),
           (unsigned long long)ubd_ns_get_num_sectors(ns), ubd_ns_get_sector_size(ns));

    /* The buffer is ours until the submit; the driver lends it back in the callback. */
    char *data = ubd_buf_data(buf);
    memset(data, 0, ubd_ns_get_sector_size(ns));
    strcpy(data, "hello from libubdirect");
    if ((rc = ubd_ns_cmd_write(ns, qp, buf, 0, 1, io_done, &io, UBD_IO_FLAGS_FUA)) < 0 ||
        (rc = wait_io(qp, &io)) < 0) {
        fail("writing LBA 0", rc);
        goto out;
    }
    memset(data, 0, ubd_ns_get_sector_size(ns));
    io.done = 0;
    if ((rc = ubd_ns_cmd_read(ns, qp, buf, 0, 1, io_done, &io, 0)) < 0 || (rc = wait_io(qp, &io)) < 0) {
        fail("reading LBA 0", rc);
        goto out;
    }
    printf("LBA 0 reads: %s\n", data);
    ret = 0;
out:
    ubd_buf_put(buf);
    ubd_qpair_free(&qp);
    ubd_ctrlr_close(&ctrlr);
    ubd_env_close(&env);
    return ret;
}
