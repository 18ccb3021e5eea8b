/**
 * The default seccomp filter. Capabilities are dropped already; this closes what an unprivileged
 * process could still reach: kernel keyrings, BPF, perf, userfaultfd, new namespaces (the way
 * to regain capabilities), handle-based opens, and the clock.
 */
const DENIED_SYSCALLS = [
  'acct',
  'add_key',
  'bpf',
  'clock_adjtime',
  'clock_settime',
  'create_module',
  'delete_module',
  'finit_module',
  'fsconfig',
  'fsmount',
  'fsopen',
  'fspick',
  'get_kernel_syms',
  'init_module',
  'ioperm',
  'iopl',
  'kexec_file_load',
  'kexec_load',
  'keyctl',
  'lookup_dcookie',
  'mount',
  'mount_setattr',
  'move_mount',
  'name_to_handle_at',
  'nfsservctl',
  'open_by_handle_at',
  'open_tree',
  'perf_event_open',
  'pivot_root',
  'process_vm_readv',
  'process_vm_writev',
  'query_module',
  'quotactl',
  'reboot',
  'request_key',
  'setns',
  'settimeofday',
  'swapoff',
  'swapon',
  'syslog',
  'umount2',
  'unshare',
  'uselib',
  'userfaultfd',
  'vm86',
  'vm86old',
];

/** Namespace flags of clone(2); any of them set means a new namespace. */
const CLONE_NAMESPACE_FLAGS = [
  0x00020000, // CLONE_NEWNS
  0x02000000, // CLONE_NEWCGROUP
  0x04000000, // CLONE_NEWUTS
  0x08000000, // CLONE_NEWIPC
  0x10000000, // CLONE_NEWUSER
  0x20000000, // CLONE_NEWPID
  0x40000000, // CLONE_NEWNET
];

const EPERM = 1;
const ENOSYS = 38;

function architectures(): string[] {
  if (process.arch === 'arm64') return ['SCMP_ARCH_AARCH64', 'SCMP_ARCH_ARM'];
  return ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'];
}

/** The OCI `linux.seccomp` section. */
export function defaultSeccompProfile(): Record<string, unknown> {
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: architectures(),
    syscalls: [
      { names: DENIED_SYSCALLS, action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      // clone3 passes its flags in memory a filter cannot read: report it missing, and libc falls
      // back to clone, whose flags the rules below check.
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      ...CLONE_NAMESPACE_FLAGS.map((flag) => ({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [
          { index: process.arch === 's390x' ? 1 : 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' },
        ],
      })),
    ],
  };
}
