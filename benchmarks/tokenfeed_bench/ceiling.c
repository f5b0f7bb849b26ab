/* The C gather ceiling for `tokenfeed bench`: the fastest plain C can copy the same
 * shuffled samples out of a memory-mapped token file into an int64 batch.
 *
 * Compiled at run time by tokenfeed_bench/ceiling.py (cc -O3 -march=native) into the
 * benchmark cache; not part of the library. A fixed pool of pthreads each own one
 * output buffer and take batches t, t+T, t+2T, ... of the cyclic sample list; thread 0
 * also records the time of each of its batches for p50/p99.
 *
 * usage: ceiling FILE DATA_OFFSET ELEM_SIZE SEQ_LEN BATCH OFFSETS_FILE WARMUP THREADS SECONDS MAX_BATCHES
 * OFFSETS_FILE holds uint64 token offsets (one per sample, sample = SEQ_LEN + 1 tokens).
 * Prints one JSON line: batches, wall_s, cpu_s, p50_ms, p99_ms, peak_rss_kb, checksum.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const unsigned char *g_data;
static size_t g_elem, g_l1, g_batch, g_noffs, g_warmup, g_max;
static const uint64_t *g_offs;
static double g_seconds;
static int g_threads;
static double *g_times;
static size_t g_ntimes;

typedef struct {
    int id;
    size_t batches;
    uint64_t checksum;
    double start, end, cpu;
} worker;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void gather(int64_t *out, size_t b) {
    for (size_t s = 0; s < g_batch; s++) {
        uint64_t off = g_offs[(b * g_batch + s) % g_noffs];
        int64_t *o = out + s * g_l1;
        if (g_elem == 2) {
            const uint16_t *src = (const uint16_t *)(g_data) + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        } else if (g_elem == 4) {
            const uint32_t *src = (const uint32_t *)(g_data) + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        } else {
            const uint8_t *src = g_data + off;
            for (size_t j = 0; j < g_l1; j++) o[j] = src[j];
        }
    }
}

static void *run(void *arg) {
    worker *w = arg;
    int64_t *out = aligned_alloc(64, ((g_batch * g_l1 * 8 + 63) / 64) * 64);
    if (!out) return NULL;
    size_t b = (size_t)w->id;
    for (size_t i = 0; i < g_warmup; i++, b += (size_t)g_threads) gather(out, b);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    double start = w->start = now();
    for (;;) {
        double t0 = now();
        gather(out, b);
        double t1 = now();
        w->checksum += (uint64_t)out[(b * 31) % (g_batch * g_l1)];
        if (w->id == 0 && g_ntimes < g_max) g_times[g_ntimes++] = t1 - t0;
        w->batches++;
        b += (size_t)g_threads;
        if (w->batches * (size_t)g_threads >= g_max || t1 - start >= g_seconds) break;
    }
    w->end = now();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    w->cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
    free(out);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: %s FILE DATA_OFFSET ELEM_SIZE SEQ_LEN BATCH OFFSETS WARMUP THREADS SECONDS MAX\n", argv[0]);
        return 2;
    }
    size_t data_off = strtoull(argv[2], NULL, 10);
    g_elem = strtoull(argv[3], NULL, 10);
    g_l1 = strtoull(argv[4], NULL, 10) + 1;
    g_batch = strtoull(argv[5], NULL, 10);
    g_warmup = strtoull(argv[7], NULL, 10);
    g_threads = atoi(argv[8]);
    g_seconds = atof(argv[9]);
    g_max = strtoull(argv[10], NULL, 10);
    if (g_threads < 1) g_threads = 1;

    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) { perror(argv[1]); return 1; }
    const unsigned char *map = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 1; }
    g_data = map + data_off;

    int ofd = open(argv[6], O_RDONLY);
    struct stat ost;
    if (ofd < 0 || fstat(ofd, &ost) < 0) { perror(argv[6]); return 1; }
    g_noffs = ost.st_size / 8;
    g_offs = mmap(NULL, ost.st_size, PROT_READ, MAP_SHARED, ofd, 0);
    if (g_offs == MAP_FAILED || g_noffs == 0) { perror("offsets"); return 1; }

    g_times = calloc(g_max + 1, sizeof(double));
    worker *ws = calloc(g_threads, sizeof(worker));
    pthread_t *th = calloc(g_threads, sizeof(pthread_t));
    for (int i = 0; i < g_threads; i++) {
        ws[i].id = i;
        pthread_create(&th[i], NULL, run, &ws[i]);
    }
    size_t total = 0;
    uint64_t sum = 0;
    double t0 = 1e300, t1 = 0, cpu = 0;
    for (int i = 0; i < g_threads; i++) {
        pthread_join(th[i], NULL);
        total += ws[i].batches;
        sum += ws[i].checksum;
        if (ws[i].start < t0) t0 = ws[i].start;
        if (ws[i].end > t1) t1 = ws[i].end;
        cpu += ws[i].cpu;
    }
    double wall = t1 - t0; /* the timed window, warm-up excluded */
    double t_sum = 0;
    for (size_t i = 0; i < g_ntimes; i++) t_sum += g_times[i];
    qsort(g_times, g_ntimes, sizeof(double), cmp);
    double p50 = g_ntimes ? g_times[g_ntimes / 2] : 0, p99 = g_ntimes ? g_times[(size_t)(g_ntimes * 0.99)] : 0;
    long hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6)) hwm = atol(line + 6);
        fclose(f);
    }
    printf("{\"batches\": %zu, \"wall_s\": %.6f, \"cpu_s\": %.6f, \"thread0_batches\": %zu, \"thread0_busy_s\": %.6f, "
           "\"p50_ms\": %.6f, \"p99_ms\": %.6f, \"peak_rss_kb\": %ld, \"warmup_per_thread\": %zu, \"checksum\": %llu}\n",
           total, wall, cpu, g_ntimes, t_sum, p50 * 1e3, p99 * 1e3, hwm, g_warmup, (unsigned long long)sum);
    return 0;
}
