/* Preloaded by scripts/bench/as_cpu.py: the process's CPUID reports fewer features, so the kernel
 * libraries that choose their code from CPUID (ONNX Runtime's MLAS, edged/cpu.py) run the code of an
 * older x86 class, natively.
 *
 * CPUID faulting (Linux arch_prctl ARCH_SET_CPUID, 0; the CPU flag cpuid_fault) makes every CPUID the
 * process runs raise SIGSEGV. The handler runs the real CPUID with faulting briefly off, clears the
 * bits EDGED_CPUID_CLEAR names, writes the result into the faulting thread's registers and steps
 * over the instruction. Threads inherit the setting; execve resets it, and a child process preloads
 * this library again from LD_PRELOAD.
 *
 * The program's own SIGSEGV handler (Python's faulthandler: pytest, `edged serve`) is kept, not
 * installed: sigaction() and signal() for SIGSEGV are interposed, and a fault that is not a CPUID
 * goes to the handler the program set, as it would have without this library.
 *
 * EDGED_CPUID_CLEAR: "LEAF.SUBLEAF.REG=HEXBITS" items separated by ';', REG one of eax ebx ecx edx,
 * e.g. "7.0.ebx=0xdc230000;7.1.eax=0x30". EDGED_CPUID_REPORT set: the count answered, at exit.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

struct clear {
    uint32_t leaf, subleaf;
    int reg; /* 0 eax, 1 ebx, 2 ecx, 3 edx */
    uint32_t bits;
};

static struct clear clears[64];
static int n_clears;
static volatile unsigned long answered;
static int installed;
static struct sigaction program; /* the SIGSEGV action the program asked for (SIG_DFL until it asks) */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static long set_cpuid(unsigned long enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

static void to_program(int sig, siginfo_t *info, void *context) {
    if (program.sa_handler == SIG_IGN || program.sa_handler == SIG_DFL) {
        struct sigaction plain = {0};
        plain.sa_handler = program.sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
        real_sigaction(sig, &plain, NULL); /* a fault happens again and does what it would have */
        if (info->si_code <= 0) raise(sig); /* sent (kill, raise): delivered again once this returns */
    } else if (program.sa_flags & SA_SIGINFO) {
        program.sa_sigaction(sig, info, context);
    } else {
        program.sa_handler(sig);
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    greg_t *g = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) {
        to_program(sig, info, context);
        return;
    }
    uint32_t leaf = (uint32_t)g[REG_RAX], subleaf = (uint32_t)g[REG_RCX], r[4];
    set_cpuid(1);
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
    set_cpuid(0);
    for (int i = 0; i < n_clears; i++)
        if (clears[i].leaf == leaf && clears[i].subleaf == subleaf) r[clears[i].reg] &= ~clears[i].bits;
    g[REG_RAX] = r[0]; /* CPUID writes the 32-bit registers, which zeroes their upper halves */
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    answered++;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGSEGV || !installed) return real_sigaction(sig, act, old);
    if (old) *old = program;
    if (act) program = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act = {0}, old;
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    return sigaction(sig, &act, &old) == 0 ? old.sa_handler : SIG_ERR;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "cpuid_mask: %s: %s\n", what, detail);
    _exit(3);
}

static void parse(const char *spec) {
    static const char *regs[] = {"eax", "ebx", "ecx", "edx"};
    char *copy = strdup(spec), *save = NULL;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        unsigned leaf, subleaf, bits;
        char reg[4];
        if (sscanf(item, "%x.%u.%3[a-z]=%x", &leaf, &subleaf, reg, &bits) != 4 || n_clears == 64)
            die("EDGED_CPUID_CLEAR item not LEAF.SUBLEAF.REG=HEXBITS", item);
        int r = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(reg, regs[i]) == 0) r = i;
        if (r < 0) die("EDGED_CPUID_CLEAR register not one of eax ebx ecx edx", item);
        clears[n_clears++] = (struct clear){leaf, subleaf, r, bits};
    }
    free(copy);
}

__attribute__((constructor)) static void start(void) {
    const char *spec = getenv("EDGED_CPUID_CLEAR");
    if (!spec) die("EDGED_CPUID_CLEAR", "not set");
    parse(spec);
    struct sigaction action = {0};
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &program) != 0) die("sigaction", strerror(errno));
    installed = 1;
    if (set_cpuid(0) != 0) die("arch_prctl(ARCH_SET_CPUID, 0): this CPU or kernel has no CPUID faulting", strerror(errno));
}

__attribute__((destructor)) static void report(void) {
    if (getenv("EDGED_CPUID_REPORT")) fprintf(stderr, "cpuid_mask: %lu CPUID answered in process %d\n", answered, getpid());
}
