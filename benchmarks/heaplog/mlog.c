/* Logs every malloc/free of a process into a static buffer, for
 * benchmarks/heap_log.py. A logger that allocates (or a Python hook that
 * reads mallinfo2) moves glibc's small chunks and with them the heap it
 * observes; this one allocates nothing: records go to a buffer in .bss and
 * are written with write(2) at exit. Build: gcc -O2 -shared -fPIC.
 * Run with LD_PRELOAD and MLOG_OUT=<file>; mlog_mark(code) (via ctypes)
 * adds a marker record. Record: op<<56 | size, pointer, sbrk(0). ops:
 * 1 malloc, 2 free, 3 calloc, 4 realloc (after a free of the old pointer),
 * 5 aligned, 9 marker. glibc only (the __libc_* entry points). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

typedef struct { uint64_t op_size, ptr, brk; } rec_t;
#define CAP (24u << 20) /* 576 MiB of address space; pages count once written */
static rec_t buf[CAP];
static uint64_t n = 0;
static int on = 0;

__attribute__((constructor)) static void init(void) { on = getenv("MLOG_OUT") != 0; }

static inline void lg(uint64_t op, uint64_t size, void *p) {
  if (!on) return;
  uint64_t i = __atomic_fetch_add(&n, 1, __ATOMIC_RELAXED);
  if (i < CAP) {
    buf[i].op_size = (op << 56) | size;
    buf[i].ptr = (uint64_t)p;
    buf[i].brk = (uint64_t)sbrk(0);
  }
}

void *malloc(size_t s) { void *p = __libc_malloc(s); lg(1, s, p); return p; }
void free(void *p) { if (p) lg(2, 0, p); __libc_free(p); }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); lg(3, a * b, p); return p; }
void *realloc(void *q, size_t s) {
  if (q) lg(2, 0, q);
  void *p = __libc_realloc(q, s);
  lg(4, s, p);
  return p;
}
int posix_memalign(void **r, size_t al, size_t s) {
  void *p = __libc_memalign(al, s);
  if (!p) return 12;
  *r = p;
  lg(5, s, p);
  return 0;
}
void *memalign(size_t al, size_t s) { void *p = __libc_memalign(al, s); lg(5, s, p); return p; }
void *aligned_alloc(size_t al, size_t s) { void *p = __libc_memalign(al, s); lg(5, s, p); return p; }
void mlog_mark(uint64_t code) { lg(9, code, 0); }

__attribute__((destructor)) static void dump(void) {
  const char *f = getenv("MLOG_OUT");
  if (!f) return;
  int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  uint64_t m = n < CAP ? n : CAP;
  char *b = (char *)buf;
  uint64_t left = m * sizeof(rec_t);
  while (left) {
    ssize_t w = write(fd, b, left > (1u << 26) ? (1u << 26) : left);
    if (w <= 0) break;
    b += w;
    left -= (uint64_t)w;
  }
  close(fd);
}
