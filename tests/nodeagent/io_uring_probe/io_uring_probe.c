/* Run inside an instance: does io_uring_setup reach the kernel? Exit 0 when a ring was
 * made (io_uring reachable), 1 when it was refused (EPERM from seccomp or
 * kernel.io_uring_disabled, ENOSYS from a kernel without it), 2 on anything else.
 * Built static (the container holds nothing else). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif

int main(void) {
    unsigned char params[120];            /* struct io_uring_params, zeroed */
    memset(params, 0, sizeof params);
    long fd = syscall(__NR_io_uring_setup, 4, params);
    if (fd >= 0) {
        printf("io_uring_setup: ring %ld\n", fd);
        return 0;
    }
    printf("io_uring_setup: %s\n", strerror(errno));
    return errno == EPERM || errno == ENOSYS ? 1 : 2;
}
