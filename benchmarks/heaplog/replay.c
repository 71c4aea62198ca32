/* Replays a heap_log malloc log against this process's glibc, keeping only
 * the blocks of at least MINSIZE bytes (the others are skipped, and so are
 * their frees): which of the logged requests make the heap grow. Prints one
 * line per marker: "mark CODE EVENT BRK MAX" (MiB above the start; a marker
 * 7, the Trainer's malloc_trim, trims here too).
 * Usage: replay LOG MINSIZE */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { uint64_t op_size, ptr, brk; } rec_t;
#define HB 26 /* open-addressing map: logged pointer -> replayed pointer */
#define MASK ((1ULL << HB) - 1)
static uint64_t *hk, *hv;

static inline uint64_t h(uint64_t k) {
  k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33;
  return k & MASK;
}
static void put(uint64_t k, uint64_t v) {
  uint64_t i = h(k);
  while (hk[i] && hk[i] != k && hk[i] != 1) i = (i + 1) & MASK;
  hk[i] = k; hv[i] = v;
}
static uint64_t take(uint64_t k) {
  for (uint64_t i = h(k); hk[i]; i = (i + 1) & MASK)
    if (hk[i] == k) { hk[i] = 1; return hv[i]; }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: replay LOG MINSIZE\n"); return 2; }
  FILE *f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 1; }
  fseek(f, 0, SEEK_END);
  long n = ftell(f) / (long)sizeof(rec_t);
  fseek(f, 0, SEEK_SET);
  rec_t *r = malloc(n * sizeof(rec_t));
  if (!r || fread(r, sizeof(rec_t), n, f) != (size_t)n) { fprintf(stderr, "short read\n"); return 1; }
  fclose(f);
  uint64_t minsize = strtoull(argv[2], 0, 10), mx = 0;
  hk = calloc(1ULL << HB, 8); hv = calloc(1ULL << HB, 8);
  uint64_t base = (uint64_t)sbrk(0);
  for (long i = 0; i < n; i++) {
    uint64_t op = r[i].op_size >> 56, s = r[i].op_size & ((1ULL << 56) - 1);
    if (op == 9) {
      uint64_t b = (uint64_t)sbrk(0) - base;
      printf("mark %lu %ld %.3f %.3f\n", (unsigned long)s, i, b / 1048576.0, mx / 1048576.0);
      if (s == 7) malloc_trim(0);
      continue;
    }
    if (op == 2) { uint64_t p = take(r[i].ptr); if (p) free((void *)p); continue; }
    if (s < minsize) continue;
    void *p;
    if (op == 5) { if (posix_memalign(&p, 64, s)) p = 0; } else p = malloc(s ? s : 1);
    if (p) { memset(p, 0, s < 64 ? s : 64); put(r[i].ptr, (uint64_t)p); }
    uint64_t b = (uint64_t)sbrk(0) - base;
    if (b > mx) mx = b;
  }
  return 0;
}
