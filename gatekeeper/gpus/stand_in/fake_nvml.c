/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests without a GPU.
 *
 * It implements the NVML entry points gatekeeper's inventory calls through pynvml
 * (nvidia-ml-py 13.615.71 and 12.535.161, whose pynvml.py layouts agree; checked) and
 * serves GPUs, processes and injected errors from a state file named by $FAKE_NVML_STATE,
 * which it re-reads on every call, so a test can change the node between two calls.
 *
 * Build: gcc -O2 -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 * -DOMIT_MEMORY_V2 and -DOMIT_PROCESSES_V3 leave those symbols out (an older driver).
 *
 * State file: one record per line, fields separated by '|', '#' starts a comment.
 *   driver|550.54.15
 *   nvml|12.550.54.15
 *   gpu|<uuid>|<name>|<pci bus id>|<total>|<reserved>|<used>|<mig 0/1>   (bytes)
 *   proc|<gpu position>|<pid>|<used bytes, or "na">
 *   fail|<symbol or *>|<gpu position or *>|<NVML return code>
 * GPU positions count gpu lines from 0. v2 memory: free = total - reserved - used;
 * v1 memory reports used + reserved as used, as real drivers do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 1024
#define MAX_FAILS 64
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

typedef unsigned long long u64;

struct fake_gpu {
    char uuid[96], name[96], pci[32];
    u64 total, reserved, used;
    unsigned mig;
};
struct fake_proc { int gpu; unsigned pid; u64 used; };
struct fake_fail { char symbol[64]; int gpu; int code; };

static struct {
    char driver[80], nvml[80];
    int ngpus, nprocs, nfails;
    struct fake_gpu gpus[MAX_GPUS];
    struct fake_proc procs[MAX_PROCS];
    struct fake_fail fails[MAX_FAILS];
} S;

/* Handles are addresses in this array; the pointed-to value is never read by callers. */
static int handles[MAX_GPUS];
static int init_count;

/* pynvml's structs (see its c_nvmlMemory_t, c_nvmlMemory_v2_t, nvmlPciInfo_t,
 * c_nvmlProcessInfo_v3_t). */
typedef struct { u64 total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; u64 total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned pid;
    u64 usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define MEMORY_V2_VERSION ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

static void copy(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

static int split(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        fields[n++] = p;
        p = strchr(p, '|');
        if (!p) break;
        *p++ = '\0';
    }
    return n;
}

static int position(const char *text) {
    return strcmp(text, "*") == 0 ? -1 : atoi(text);
}

static void parse_line(char **f, int n) {
    if (n >= 2 && strcmp(f[0], "driver") == 0) {
        copy(S.driver, sizeof S.driver, f[1]);
    } else if (n >= 2 && strcmp(f[0], "nvml") == 0) {
        copy(S.nvml, sizeof S.nvml, f[1]);
    } else if (n >= 8 && strcmp(f[0], "gpu") == 0 && S.ngpus < MAX_GPUS) {
        struct fake_gpu *g = &S.gpus[S.ngpus++];
        copy(g->uuid, sizeof g->uuid, f[1]);
        copy(g->name, sizeof g->name, f[2]);
        copy(g->pci, sizeof g->pci, f[3]);
        g->total = strtoull(f[4], NULL, 10);
        g->reserved = strtoull(f[5], NULL, 10);
        g->used = strtoull(f[6], NULL, 10);
        g->mig = (unsigned)atoi(f[7]);
    } else if (n >= 4 && strcmp(f[0], "proc") == 0 && S.nprocs < MAX_PROCS) {
        struct fake_proc *p = &S.procs[S.nprocs++];
        p->gpu = atoi(f[1]);
        p->pid = (unsigned)strtoul(f[2], NULL, 10);
        p->used = strcmp(f[3], "na") == 0 ? NOT_AVAILABLE : strtoull(f[3], NULL, 10);
    } else if (n >= 4 && strcmp(f[0], "fail") == 0 && S.nfails < MAX_FAILS) {
        struct fake_fail *x = &S.fails[S.nfails++];
        copy(x->symbol, sizeof x->symbol, f[1]);
        x->gpu = position(f[2]);
        x->code = atoi(f[3]);
    }
}

/* Re-read the state file; a missing $FAKE_NVML_STATE means a node without GPUs. */
static int load_state(void) {
    memset(&S, 0, sizeof S);
    copy(S.driver, sizeof S.driver, "550.54.15");
    copy(S.nvml, sizeof S.nvml, "12.550.54.15");
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path || !*path) return NVML_SUCCESS;
    FILE *file = fopen(path, "r");
    if (!file) return NVML_ERROR_UNKNOWN;
    char line[512];
    char *fields[10];
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        parse_line(fields, split(line, fields, 10));
    }
    fclose(file);
    return NVML_SUCCESS;
}

/* Common entry: reload, check initialisation, apply injected failures. */
static int enter(const char *symbol, int gpu) {
    int rc = load_state();
    if (rc != NVML_SUCCESS) return rc;
    for (int i = 0; i < S.nfails; i++) {
        const struct fake_fail *x = &S.fails[i];
        int symbol_matches = strcmp(x->symbol, "*") == 0 || strcmp(x->symbol, symbol) == 0;
        int gpu_matches = x->gpu == -1 || x->gpu == gpu;
        if (symbol_matches && gpu_matches) return x->code;
    }
    if (init_count == 0 && strcmp(symbol, "nvmlInitWithFlags") != 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

/* Device entry: resolve the handle first so failures can target one GPU. */
static int enter_device(const char *symbol, void *handle, struct fake_gpu **gpu) {
    int index = (int)((int *)handle - handles);
    if (!handle || index < 0 || index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    int rc = enter(symbol, index);
    if (rc != NVML_SUCCESS) return rc;
    if (index >= S.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &S.gpus[index];
    return NVML_SUCCESS;
}

static int put_string(char *dst, unsigned length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    int rc = enter("nvmlInitWithFlags", -1);
    if (rc == NVML_SUCCESS) init_count++;
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    int rc = enter("nvmlShutdown", -1);
    if (rc == NVML_SUCCESS) init_count--;
    return rc;
}

/* Not part of NVML: lets tests check that every init was matched by a shutdown. */
int fakeNvmlInitCount(void) { return init_count; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    int rc = enter("nvmlSystemGetDriverVersion", -1);
    return rc != NVML_SUCCESS ? rc : put_string(version, length, S.driver);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned length) {
    int rc = enter("nvmlSystemGetNVMLVersion", -1);
    return rc != NVML_SUCCESS ? rc : put_string(version, length, S.nvml);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    int rc = enter("nvmlDeviceGetCount_v2", -1);
    if (rc != NVML_SUCCESS) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)S.ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    int rc = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (rc != NVML_SUCCESS) return rc;
    if (!device || index >= (unsigned)S.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned length) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetName", device, &g);
    return rc != NVML_SUCCESS ? rc : put_string(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned length) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetUUID", device, &g);
    return rc != NVML_SUCCESS ? rc : put_string(uuid, length, g->uuid);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetPciInfo_v3", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    copy(pci->busId, sizeof pci->busId, g->pci);
    copy(pci->busIdLegacy, sizeof pci->busIdLegacy, g->pci + (strlen(g->pci) > 12 ? 4 : 0));
    sscanf(g->pci, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned *current, unsigned *pending) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetMigMode", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = g->mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetMemoryInfo", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->total;
    memory->used = g->used + g->reserved;
    memory->free = g->total - g->reserved - g->used;
    return NVML_SUCCESS;
}

#ifndef OMIT_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    struct fake_gpu *g;
    int rc = enter_device("nvmlDeviceGetMemoryInfo_v2", device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != MEMORY_V2_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = g->total;
    memory->reserved = g->reserved;
    memory->used = g->used;
    memory->free = g->total - g->reserved - g->used;
    return NVML_SUCCESS;
}
#endif

/* NVML's two-call protocol: too small a buffer sets *count and asks for more. */
static int list_processes(const char *symbol, void *device, unsigned *count,
                          nvmlProcessInfo_t *infos) {
    struct fake_gpu *g;
    int rc = enter_device(symbol, device, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    int index = (int)(g - S.gpus);
    unsigned n = 0;
    for (int i = 0; i < S.nprocs; i++) n += S.procs[i].gpu == index;
    if (n == 0 || *count < n || !infos) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned k = 0;
    for (int i = 0; i < S.nprocs; i++) {
        if (S.procs[i].gpu != index) continue;
        infos[k].pid = S.procs[i].pid;
        infos[k].usedGpuMemory = S.procs[i].used;
        infos[k].gpuInstanceId = 0xFFFFFFFFu;
        infos[k].computeInstanceId = 0xFFFFFFFFu;
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}

#ifndef OMIT_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count,
                                                     nvmlProcessInfo_t *infos) {
    return list_processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *device, unsigned *count,
                                                     nvmlProcessInfo_t *infos) {
    return list_processes("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos);
}
