/* A stand-in libnvidia-ml.so.1 for hosts without an NVIDIA GPU: it implements the NVML
 * calls the node agent makes through pynvml (nvidia-ml-py), so the agent's real NVML code
 * path runs in tests. Behaviour from the environment, read at nvmlInit:
 *   NVML_STUB_GPUS      number of GPUs (default 2)
 *   NVML_STUB_ECC_GPU   index of a GPU reporting uncorrected ECC errors (default none)
 *   NVML_STUB_XID       "index:xid": one Xid event delivered on the first event wait
 *   NVML_STUB_TEMP      temperature of every GPU in C (default 41)
 *   NVML_STUB_LOST_GPU  index of a GPU that has "fallen off the bus": its name, memory
 *                       and temperature calls fail with NVML_ERROR_GPU_IS_LOST
 * Health beyond ECC, "index" or "index:value":
 *   NVML_STUB_REMAP_PENDING / NVML_STUB_REMAP_FAILED   row remapping pending / failed
 *   NVML_STUB_RETIRED_PENDING                          page retirement pending
 *   NVML_STUB_NVLINKS   NVLink links per GPU (default 0: a PCIe card, no P2P over NVLink)
 *   NVML_STUB_NVLINK_DOWN  index of a GPU whose link 0 is inactive
 *   NVML_STUB_NVLINK_CRC   "index:count" CRC flit errors on that GPU's link 0
 *   NVML_STUB_PCIE_WIDTH   "index:width" trained link width (default x16 of x16, gen 5 of 5)
 *   NVML_STUB_THROTTLE     "index:mask" current clocks event reasons
 *   NVML_STUB_MIG          index of a GPU with MIG mode enabled
 *   NVML_STUB_FABRIC       fabric state of every GPU (0 not supported, 1 not started,
 *                          2 in progress, 3 completed)
 *   NVML_STUB_CUDA         CUDA driver version (default 12040)
 * Burn-in checks (docs/adr/0013), "index:value":
 *   NVML_STUB_BRAND        nvmlBrandType_t of every GPU (default 14, NVIDIA: an H100)
 *   NVML_STUB_RECOVERY     "index:action" GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
 *   NVML_STUB_PCIE_GEN     "index:gen" trained link generation
 *   NVML_STUB_REMAPPED     "index:rows" correctable remapped rows
 *   NVML_STUB_RETIRED      "index:pages" pages retired for double-bit ECC errors
 * Telemetry (nodeagent/telemetry.py), every GPU alike, re-read like the fault schedule:
 *   NVML_STUB_UTIL        GPU utilisation in % (default 0)
 *   NVML_STUB_MEM_USED_MB memory used in MiB (default 0)
 *   NVML_STUB_POWER_MW    power draw in mW (default 70000)
 *   NVML_STUB_SM_MHZ      SM clock in MHz (default 1980)
 *   NVML_STUB_ECC_CORRECTED  volatile corrected ECC count (default 0)
 * Fault schedule: NVML_STUB_FAULTS names a file of KEY=VALUE lines (the names above);
 * it is re-read on every nvmlSystemGetDriverVersion (once per agent inventory), so a
 * test can inject or clear a fault while the agent runs.
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
static int remap_pending_gpu = -1, remap_failed_gpu = -1, retired_pending_gpu = -1;
static int nvlinks, nvlink_down_gpu = -1, crc_gpu = -1, width_gpu = -1, throttle_gpu = -1;
static int mig_gpu = -1, fabric_state, cuda_version = 12040;
static unsigned long long crc_count, throttle_mask;
static unsigned width_value = 16;
static int brand = 14, recovery_gpu = -1, gen_gpu = -1, remapped_gpu = -1, retired_gpu = -1;
static unsigned long long recovery_value, gen_value = 5, remapped_value, retired_value;
static unsigned util_percent, mem_used_mb, power_mw = 70000, sm_mhz = 1980, ecc_corrected;

/* The fault schedule file's value for `name`, else the environment's. */
static char fault_line[256];
static const char *setting(const char *name) {
    const char *path = getenv("NVML_STUB_FAULTS");
    size_t n = strlen(name);
    if (path && *path) {
        FILE *file = fopen(path, "r");
        if (file) {
            while (fgets(fault_line, sizeof fault_line, file)) {
                if (strncmp(fault_line, name, n) == 0 && fault_line[n] == '=') {
                    fclose(file);
                    fault_line[strcspn(fault_line, "\r\n")] = 0;
                    return fault_line + n + 1;
                }
            }
            fclose(file);
        }
    }
    return getenv(name);
}

static int env_int(const char *name, int fallback) {
    const char *value = setting(name);
    return value && *value ? atoi(value) : fallback;
}

static int env_pair(const char *name, unsigned long long *value) {
    const char *text = setting(name);
    int index;
    if (text && sscanf(text, "%d:%lli", &index, value) == 2) return index;
    return -1;
}

static void read_health_settings(void) {
    remap_pending_gpu = env_int("NVML_STUB_REMAP_PENDING", -1);
    remap_failed_gpu = env_int("NVML_STUB_REMAP_FAILED", -1);
    retired_pending_gpu = env_int("NVML_STUB_RETIRED_PENDING", -1);
    nvlinks = env_int("NVML_STUB_NVLINKS", 0);
    nvlink_down_gpu = env_int("NVML_STUB_NVLINK_DOWN", -1);
    crc_gpu = env_pair("NVML_STUB_NVLINK_CRC", &crc_count);
    unsigned long long width = 16;
    width_gpu = env_pair("NVML_STUB_PCIE_WIDTH", &width);
    width_value = (unsigned)width;
    throttle_gpu = env_pair("NVML_STUB_THROTTLE", &throttle_mask);
    mig_gpu = env_int("NVML_STUB_MIG", -1);
    fabric_state = env_int("NVML_STUB_FABRIC", 0);
    cuda_version = env_int("NVML_STUB_CUDA", 12040);
    ecc_gpu = env_int("NVML_STUB_ECC_GPU", -1);
    brand = env_int("NVML_STUB_BRAND", 14);
    recovery_gpu = env_pair("NVML_STUB_RECOVERY", &recovery_value);
    gen_value = 5;
    gen_gpu = env_pair("NVML_STUB_PCIE_GEN", &gen_value);
    remapped_gpu = env_pair("NVML_STUB_REMAPPED", &remapped_value);
    retired_gpu = env_pair("NVML_STUB_RETIRED", &retired_value);
    temperature = (unsigned)env_int("NVML_STUB_TEMP", 41);
    util_percent = (unsigned)env_int("NVML_STUB_UTIL", 0);
    mem_used_mb = (unsigned)env_int("NVML_STUB_MEM_USED_MB", 0);
    power_mw = (unsigned)env_int("NVML_STUB_POWER_MW", 70000);
    sm_mhz = (unsigned)env_int("NVML_STUB_SM_MHZ", 1980);
    ecc_corrected = (unsigned)env_int("NVML_STUB_ECC_CORRECTED", 0);
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    gpu_count = (unsigned)env_int("NVML_STUB_GPUS", 2);
    if (gpu_count > MAX_GPUS) gpu_count = MAX_GPUS;
    for (unsigned i = 0; i < gpu_count; i++) devices[i].index = i;
    lost_gpu = env_int("NVML_STUB_LOST_GPU", -1);
    read_health_settings();
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
    if (!initialised) return ERR_UNINITIALIZED;
    read_health_settings();
    return copy_text(version, length, "550.54.15");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialised) return ERR_UNINITIALIZED;
    *version = cuda_version;
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
    memory->used = (unsigned long long)mem_used_mb * 1024 * 1024;
    memory->free = memory->total - memory->used;
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
    if (error_type == 0) *count = ecc_corrected;   /* NVML_MEMORY_ERROR_TYPE_CORRECTED */
    return OK;
}

/* --- telemetry ------------------------------------------------------------------------- */
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    if (lost(device)) return ERR_GPU_IS_LOST;
    read_health_settings();      /* the sampler runs between inventories: follow the schedule */
    util->gpu = util_percent;
    util->memory = util_percent / 2;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *milliwatts) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *milliwatts = power_mw;
    return OK;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned *clock) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *clock = type == 1 ? sm_mhz : 2619;   /* NVML_CLOCK_SM, else the memory clock */
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

/* --- health beyond ECC, topology ------------------------------------------------------- */
static int is(nvmlDevice_t device, int index) { return (int)device->index == index; }

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned *corr, unsigned *unc,
                                       unsigned *pending, unsigned *failure) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *corr = is(device, remapped_gpu) ? (unsigned)remapped_value : 0;
    *unc = is(device, remap_failed_gpu) ? 1 : 0;
    *pending = is(device, remap_pending_gpu) ? 1 : 0;
    *failure = is(device, remap_failed_gpu) ? 1 : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *pending = is(device, retired_pending_gpu) ? 1 : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned link, unsigned *active) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    if ((int)link >= nvlinks) return 3;   /* NVML_ERROR_NOT_SUPPORTED */
    *active = (link == 0 && is(device, nvlink_down_gpu)) ? 0 : 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned link, int counter,
                                             unsigned long long *value) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    if ((int)link >= nvlinks) return 3;
    /* counter 2 = NVML_NVLINK_ERROR_DL_CRC_FLIT */
    *value = (counter == 2 && link == 0 && is(device, crc_gpu)) ? crc_count : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    if (!valid(a) || !valid(b)) return ERR_INVALID_ARGUMENT;
    /* index 2 = NVML_P2P_CAPS_INDEX_NVLINK; status 0 = OK, 5 = NOT_SUPPORTED */
    *status = (index == 2 && nvlinks > 0 && a != b) ? 0 : 5;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned *gen) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *gen = is(device, gen_gpu) ? (unsigned)gen_value : 5;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned *gen) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *gen = 5;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned *width) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *width = is(device, width_gpu) ? width_value : 16;
    return OK;
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned *width) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *width = 16;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *mask) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *mask = is(device, throttle_gpu) ? throttle_mask : 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *mask) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, mask);
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned *current, unsigned *pending) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *current = *pending = is(device, mig_gpu) ? 1 : 0;
    return OK;
}
struct fabric_info { unsigned char cluster_uuid[16]; int status; unsigned clique; unsigned char state; };
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, struct fabric_info *info) {
    if (!valid(device) || !info) return ERR_INVALID_ARGUMENT;
    if (fabric_state == 0) return 3;   /* not an NVSwitch system */
    memset(info, 0, sizeof *info);
    info->status = 0;
    info->state = (unsigned char)fabric_state;
    return OK;
}

/* --- burn-in checks: brand, recovery action, retired pages --------------------------- */
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type) {
    if (!valid(device)) return ERR_INVALID_ARGUMENT;
    *type = brand;
    return OK;
}
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; } value;
} nvmlFieldValue_t;
#define FI_GPU_RECOVERY_ACTION 230
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    if (!valid(device) || count < 0 || !values) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        values[i].valueType = 1;    /* NVML_VALUE_TYPE_UNSIGNED_INT */
        if (values[i].fieldId == FI_GPU_RECOVERY_ACTION) {
            values[i].nvmlReturn = OK;
            values[i].value.ui = is(device, recovery_gpu) ? (unsigned)recovery_value : 0;
        } else {
            values[i].nvmlReturn = 3;   /* NVML_ERROR_NOT_SUPPORTED */
        }
    }
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned *count,
                                       unsigned long long *addresses) {
    if (!valid(device) || !count) return ERR_INVALID_ARGUMENT;
    unsigned pages = (cause == 1 && is(device, retired_gpu)) ? (unsigned)retired_value : 0;
    if (!addresses) { *count = pages; return OK; }
    if (*count < pages) { *count = pages; return ERR_INSUFFICIENT_SIZE; }
    for (unsigned i = 0; i < pages; i++) addresses[i] = 0x1000ULL * (i + 1);
    *count = pages;
    return OK;
}
