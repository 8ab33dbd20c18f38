/* A stand-in libcuda.so.1 for hosts without an NVIDIA GPU: the CUDA driver API calls the
 * agent's GPU memory clearing routine (nodeagent/gpu_memory.py) makes, over host memory,
 * so that routine's real code path runs in tests. Each process starts with every device's
 * memory holding the last tenant's bytes (0xA5), as a GPU does after a lease.
 * Behaviour from the environment, read at cuInit:
 *   CUDA_STUB_GPUS       number of devices (default NVML_STUB_GPUS, else 2); UUIDs as the
 *                        NVML stub's: GPU-5ca1ab1e-0000-4000-8000-<index as 12 digits>
 *   CUDA_STUB_MEMORY_MB  each device's memory in MiB (default 64), of which 1 MiB is the
 *                        driver's own and never handed out (as a real context's)
 *   CUDA_STUB_FAULT      "init": cuInit fails (no device); "memset": cuMemsetD8 writes
 *                        nothing (memory keeps the tenant's bytes); "hang": it never returns
 *   CUDA_STUB_REPORT     a file: at exit, one line per device this process touched,
 *                        "<uuid> bytes=<allocatable bytes> nonzero=<of those, not zero>",
 *                        the tests' own proof of what the routine left in memory.
 *   CUDA_STUB_H2D_GBPS   host-to-device copy rate the CUDA events report (default 50, GB/s:
 *                        a PCIe gen 5 x16 link at 79 % of its peak), for the bandwidth routine
 *                        (nodeagent/gpu_bandwidth.py): elapsed time comes from the bytes
 *                        copied between two events, not from a clock, so load cannot change it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_OUT_OF_MEMORY = 2, ERR_NOT_INITIALIZED = 3,
       ERR_NO_DEVICE = 100, ERR_INVALID_DEVICE = 101 };
#define MAX_DEVICES 16
#define RESERVED (1024ULL * 1024)
#define BASE 0x7f0000000000ULL
#define SPAN (1ULL << 36)

static struct dev {
    unsigned char *memory;            /* allocated on first use, filled with 0xA5 */
    size_t size, next;                /* bump allocator over [RESERVED, size) */
    int live;                         /* allocations not yet freed */
} devices[MAX_DEVICES];
static int device_count, initialised, current = -1;
static size_t memory_bytes = 64ULL * 1024 * 1024;
static const char *fault = "";

static void uuid_bytes(int index, unsigned char out[16]) {
    char text[33];
    snprintf(text, sizeof text, "5ca1ab1e000040008000%012d", index);
    for (int i = 0; i < 16; i++) {
        unsigned value;
        sscanf(text + 2 * i, "%2x", &value);
        out[i] = (unsigned char)value;
    }
}

static void report(void) {
    const char *path = getenv("CUDA_STUB_REPORT");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f) return;
    for (int d = 0; d < device_count; d++) {
        if (!devices[d].memory) continue;
        unsigned char u[16];
        uuid_bytes(d, u);
        size_t nonzero = 0;
        for (size_t i = RESERVED; i < devices[d].size; i++) nonzero += devices[d].memory[i] != 0;
        fprintf(f, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x "
                "bytes=%zu nonzero=%zu\n", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8],
                u[9], u[10], u[11], u[12], u[13], u[14], u[15], (size_t)(devices[d].size - RESERVED), nonzero);
    }
    fclose(f);
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    const char *v = getenv("CUDA_STUB_FAULT");
    fault = v ? v : "";
    if (!strcmp(fault, "init")) return ERR_NO_DEVICE;
    v = getenv("CUDA_STUB_GPUS");
    if (!v) v = getenv("NVML_STUB_GPUS");
    device_count = v ? atoi(v) : 2;
    if (device_count < 0 || device_count > MAX_DEVICES) device_count = 2;
    v = getenv("CUDA_STUB_MEMORY_MB");
    if (v && atoi(v) > 1) memory_bytes = (size_t)atoi(v) * 1024 * 1024;
    if (!initialised) atexit(report);
    initialised = 1;
    return OK;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return ERR_NOT_INITIALIZED;
    *count = device_count;
    return OK;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return ERR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count) return ERR_INVALID_DEVICE;
    *device = ordinal;
    return OK;
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice device) {
    if (device < 0 || device >= device_count) return ERR_INVALID_DEVICE;
    uuid_bytes(device, uuid);
    return OK;
}

CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice device) {
    return cuDeviceGetUuid(uuid, device);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
    if (device < 0 || device >= device_count) return ERR_INVALID_DEVICE;
    struct dev *d = &devices[device];
    if (!d->memory) {
        d->memory = malloc(memory_bytes);
        if (!d->memory) return ERR_OUT_OF_MEMORY;
        memset(d->memory, 0xA5, memory_bytes);      /* the last tenant's bytes */
        d->size = memory_bytes;
        d->next = RESERVED;
    }
    *ctx = (CUcontext)(uintptr_t)(device + 1);
    return OK;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    return device >= 0 && device < device_count ? OK : ERR_INVALID_DEVICE;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) { return cuDevicePrimaryCtxRelease(device); }

CUresult cuCtxSetCurrent(CUcontext ctx) {
    int device = (int)(uintptr_t)ctx - 1;
    if (device < 0 || device >= device_count || !devices[device].memory) return ERR_INVALID_VALUE;
    current = device;
    return OK;
}

CUresult cuCtxSynchronize(void) { return current < 0 ? ERR_INVALID_VALUE : OK; }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (current < 0) return ERR_INVALID_VALUE;
    *free_bytes = devices[current].size - devices[current].next;
    *total_bytes = devices[current].size;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t size) {
    if (current < 0) return ERR_INVALID_VALUE;
    struct dev *d = &devices[current];
    if (size == 0 || size > d->size - d->next) return ERR_OUT_OF_MEMORY;
    *pointer = BASE + (CUdeviceptr)current * SPAN + d->next;
    d->next += size;
    d->live++;
    return OK;
}

static unsigned char *host(CUdeviceptr pointer, size_t size) {
    if (pointer < BASE) return NULL;
    unsigned long long device = (pointer - BASE) / SPAN, offset = (pointer - BASE) % SPAN;
    if (device >= (unsigned long long)device_count || !devices[device].memory) return NULL;
    if (offset < RESERVED || offset + size > devices[device].next) return NULL;
    return devices[device].memory + offset;
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    if (!host(pointer, 0)) return ERR_INVALID_VALUE;
    struct dev *d = &devices[(pointer - BASE) / SPAN];
    if (--d->live == 0) d->next = RESERVED;
    return OK;
}

CUresult cuMemsetD8_v2(CUdeviceptr pointer, unsigned char value, size_t count) {
    unsigned char *p = host(pointer, count);
    if (!p) return ERR_INVALID_VALUE;
    if (!strcmp(fault, "hang")) for (;;) pause();
    if (strcmp(fault, "memset")) memset(p, value, count);
    return OK;
}

CUresult cuMemcpyDtoH_v2(void *destination, CUdeviceptr source, size_t count) {
    unsigned char *p = host(source, count);
    if (!p) return ERR_INVALID_VALUE;
    memcpy(destination, p, count);
    return OK;
}

/* --- host-to-device bandwidth: pinned host memory, async copies, events ---------------- */
typedef struct { unsigned long long copied; int recorded; } *CUevent;
static unsigned long long h2d_copied;

CUresult cuMemAllocHost_v2(void **pointer, size_t size) {
    if (current < 0) return ERR_INVALID_VALUE;
    *pointer = malloc(size ? size : 1);
    return *pointer ? OK : ERR_OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *pointer) { free(pointer); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr destination, const void *source, size_t count, void *stream) {
    (void)stream;
    unsigned char *p = host(destination, count);
    if (!p) return ERR_INVALID_VALUE;
    memcpy(p, source, count);
    h2d_copied += count;
    return OK;
}
CUresult cuEventCreate(CUevent *event, unsigned flags) {
    (void)flags;
    if (current < 0) return ERR_INVALID_VALUE;
    *event = calloc(1, sizeof **event);
    return *event ? OK : ERR_OUT_OF_MEMORY;
}
CUresult cuEventRecord(CUevent event, void *stream) {
    (void)stream;
    if (!event) return ERR_INVALID_VALUE;
    event->copied = h2d_copied;
    event->recorded = 1;
    return OK;
}
CUresult cuEventSynchronize(CUevent event) { return event && event->recorded ? OK : ERR_INVALID_VALUE; }
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!start || !end || !start->recorded || !end->recorded) return ERR_INVALID_VALUE;
    const char *v = getenv("CUDA_STUB_H2D_GBPS");
    double gbps = v && atof(v) > 0 ? atof(v) : 50.0;
    *ms = (float)((double)(end->copied - start->copied) / (gbps * 1e9) * 1000.0);
    return OK;
}
CUresult cuEventDestroy_v2(CUevent event) { free(event); return OK; }
