/* A stand-in libnvidia-ml.so.1 for hosts without an NVIDIA GPU: it implements the NVML
 * calls the node agent makes through pynvml (nvidia-ml-py), so the agent's real NVML code
 * path runs in tests. Behaviour from the environment, read at nvmlInit:
 *   NVML_STUB_GPUS      number of GPUs (default 2)
 *   NVML_STUB_ECC_GPU   index of a GPU reporting uncorrected ECC errors (default none)
 *   NVML_STUB_XID       "index:xid": one Xid event delivered on the first event wait
 *   NVML_STUB_TEMP      temperature of every GPU in C (default 41)
 *   NVML_STUB_LOST_GPU  index of a GPU that has "fallen off the bus": its name, memory
 *                       and temperature calls fail with NVML_ERROR_GPU_IS_LOST
 * UUIDs are GPU-5ca1ab1e-0000-4000-8000-00000000000<index>. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { OK = 0, ERR_UNINITIALIZED = 1, ERR_INVALID_ARGUMENT = 2, ERR_INSUFFICIENT_SIZE = 7,
       ERR_TIMEOUT = 10, ERR_GPU_IS_LOST = 15 };
#define MAX_GPUS 16

struct device { unsigned index; };
typedef struct device *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { int registered; } *nvmlEventSet_t;

static struct device devices[MAX_GPUS];
static unsigned gpu_count;
static int ecc_gpu = -1, xid_gpu = -1, lost_gpu = -1, initialised;
static unsigned long long xid_code;
static unsigned temperature = 41;
static struct { int registered; } event_set;

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    gpu_count = (unsigned)env_int("NVML_STUB_GPUS", 2);
    if (gpu_count > MAX_GPUS) gpu_count = MAX_GPUS;
    for (unsigned i = 0; i < gpu_count; i++) devices[i].index = i;
    ecc_gpu = env_int("NVML_STUB_ECC_GPU", -1);
    lost_gpu = env_int("NVML_STUB_LOST_GPU", -1);
    temperature = (unsigned)env_int("NVML_STUB_TEMP", 41);
    const char *xid = getenv("NVML_STUB_XID");
    if (xid && sscanf(xid, "%d:%llu", &xid_gpu, &xid_code) != 2) xid_gpu = -1;
    initialised = 1;
    return OK;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { initialised = 0; return OK; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case OK: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERR_TIMEOUT: return "Timeout";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(char *out, unsigned length, const char *text) {
    if (!out || strlen(text) + 1 > length) return ERR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return OK;
}

static int valid(nvmlDevice_t device) {
    return initialised && device >= devices && device < devices + gpu_count;
}

static int lost(nvmlDevice_t device) { return (int)device->index == lost_gpu; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    return initialised ? copy_text(version, length, "550.54.15") : ERR_UNINITIALIZED;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return ERR_UNINITIALIZED;
    *version = 12040;
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialised) return ERR_UNINITIALIZED;
    *count = gpu_count;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    if (!initialised) return ERR_UNINITIALIZED;
    if (index >= gpu_count) return ERR_INVALID_ARGUMENT;
    *device = &devices[index];
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length) {
    char text[64];
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    snprintf(text, sizeof text, "GPU-5ca1ab1e-0000-4000-8000-%012u", device->index);
    return copy_text(uuid, length, text);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    if (lost(device)) return ERR_GPU_IS_LOST;
    return copy_text(name, length, "Stub NVIDIA H100 80GB HBM3");
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    if (lost(device)) return ERR_GPU_IS_LOST;
    memory->total = 81559ULL * 1024 * 1024;
    memory->used = 0;
    memory->free = memory->total;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned *temp) {
    (void)sensor;
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *temp = temperature;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter,
                                         unsigned long long *count) {
    (void)counter;
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    /* error_type 1 = NVML_MEMORY_ERROR_TYPE_UNCORRECTED */
    *count = (error_type == 1 && (int)device->index == ecc_gpu) ? 3 : 0;
    return OK;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised) return ERR_UNINITIALIZED;
    *set = (nvmlEventSet_t)&event_set;
    return OK;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    (void)types;
    if (!valid(device) || !set) return ERR_INVALID_ARGUMENT;
    set->registered = 1;
    return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned ms) {
    (void)ms;
    if (!set || !set->registered) return ERR_INVALID_ARGUMENT;
    if (xid_gpu < 0 || xid_gpu >= (int)gpu_count) return ERR_TIMEOUT;
    memset(data, 0, sizeof *data);
    data->device = &devices[xid_gpu];
    data->eventType = 0x8;   /* nvmlEventTypeXidCriticalError */
    data->eventData = xid_code;
    xid_gpu = -1;            /* delivered once */
    return OK;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { (void)set; return OK; }
