// LD_PRELOAD shim: the process is refused the AMX tile state, as on a CPU without AMX.
//
// ONNX Runtime's MLAS asks Linux for the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), through libc's syscall()) before it dispatches its AMX kernels; when the
// request fails it keeps to AVX-512 VNNI. So this shim makes the same ONNX Runtime on the same chip
// run its non-AMX kernels, which is how scripts/cpu_variants.sh measures figures "without AMX".
// Every other system call passes through unchanged.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#define ONNXOPT_ARCH_REQ_XCOMP_PERM 0x1023

typedef long (*syscall_fn)(long, ...);

long syscall(long number, ...) {
  va_list args;
  va_start(args, number);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(args, long);
  va_end(args);
  if (number == SYS_arch_prctl && a[0] == ONNXOPT_ARCH_REQ_XCOMP_PERM) {
    errno = EPERM;
    return -1;
  }
  static syscall_fn next;
  if (next == 0) next = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
  return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
