/* llmc_ref — the batches llm.c's DataLoader (llmc_dataloader.h) gives one
 * process, written out for tests/order/test_llmc_order.py:
 *
 *   llmc_ref B T num_processes rank shuffle seed steps out.bin shard...
 *
 * writes `steps` batches of B*T + 1 uint16 tokens (llm.c's buffer after each
 * dataloader_next_batch; row j is tokens [j*T, j*T + T + 1) of it). Exit 0,
 * or 1 with a message when llm.c's loader would have stopped. */
#include "llmc_dataloader.h"

int main(int argc, char **argv) {
    if (argc < 10) {
        fprintf(stderr, "usage: %s B T num_processes rank shuffle seed steps out.bin shard...\n", argv[0]);
        return T_EXIT_FAIL;
    }
    size_t B = strtoul(argv[1], NULL, 10), T = strtoul(argv[2], NULL, 10);
    int R = atoi(argv[3]), rank = atoi(argv[4]), shuffle = atoi(argv[5]);
    uint32_t seed = (uint32_t)strtoul(argv[6], NULL, 10);
    unsigned long steps = strtoul(argv[7], NULL, 10);
    FILE *out = fopen(argv[8], "wb");
    if (!out) return T_EXIT_FAIL;
    DataLoader loader;
    dataloader_init(&loader, (const char *const *)argv + 9, (size_t)(argc - 9), B, T, rank, R, shuffle, seed);
    for (unsigned long k = 0; k < steps && !t_failures; k++) {
        dataloader_next_batch(&loader);
        CHECK(fwrite(loader.buffer, sizeof *loader.buffer, B * T + 1, out) == B * T + 1);
    }
    dataloader_free(&loader);
    CHECK(fclose(out) == 0);
    return t_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
