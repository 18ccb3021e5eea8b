import type { SandboxSpec } from '../contract.ts';
import { cgroupLimitsOf } from '../host/cgroups.ts';
import { defaultSeccompProfile } from './seccomp-profile.ts';

/** Where the agent binary appears inside every container: on /dev's tmpfs, so it never lands in the upper dir. */
const AGENT_PATH_IN_SANDBOX = '/dev/.sandgym-agent';

/**
 * What commands get: Docker's default set, less NET_RAW and MKNOD, enough for package managers and
 * nothing to escape with. Where the host has CAP_SYS_RESOURCE to give, the agent also holds it, to
 * put itself out of the OOM killer's reach; each command drops it before it starts
 * (agent/selfstate.c).
 */
const CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_KILL',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_AUDIT_WRITE',
  'CAP_SETFCAP',
];

/** Most pseudo-terminals one sandbox may hold: its own devpts instance's cap (see host-setup's pty.max). */
const SANDBOX_MAX_PTYS = 256;

/** The OCI runtime spec's default masked and read-only paths. */
const MASKED_PATHS = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/proc/kpagecgroup',
  '/proc/kpagecount',
  '/proc/kpageflags',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
  // The agent's OOM score (see agent/selfstate.c): a process of the sandbox, root too, could
  // otherwise raise it so that an OOM it caused ends the agent and the sandbox with it.
  '/proc/1/oom_score_adj',
  '/proc/1/oom_adj',
  '/proc/1/task/1/oom_score_adj',
  '/proc/1/task/1/oom_adj',
];
const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

/** Inputs of {@link buildOciConfig} besides the spec. */
export interface OciConfigInputs {
  spec: SandboxSpec;
  agentHostPath: string;
  cgroupsPath: string;
  /** The agent keeps the sandbox alive when its owner goes away, for a successor to adopt. */
  durable?: boolean;
  /** The root folder: the bundle's `rootfs` (an overlay the launcher mounts), or a shared read-only folder. */
  root?: { path: string; readonly: boolean };
  /** The host can give CAP_SYS_RESOURCE (its bounding set has it; some virtualised hosts lack it). */
  hostHasSysResource?: boolean;
}

/** The bundle's config.json: the agent as pid 1 over an overlay root, isolated and limited. */
export function buildOciConfig({
  spec,
  agentHostPath,
  cgroupsPath,
  durable = false,
  root = { path: 'rootfs', readonly: false },
  hostHasSysResource = false,
}: OciConfigInputs): Record<string, unknown> {
  const agentCapabilities = hostHasSysResource ? [...CAPABILITIES, 'CAP_SYS_RESOURCE'] : CAPABILITIES;
  const env = {
    PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    HOME: '/root',
    LANG: 'C.UTF-8',
    ...spec.env,
  };
  const limits = cgroupLimitsOf(spec.resources, spec.qos);
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: [
        AGENT_PATH_IN_SANDBOX,
        ...(durable ? ['--durable'] : []),
        // the CPU class is set on the agent, so every command inherits it
        ...(spec.qos === 'best_effort' ? ['--sched-idle'] : ['--core-cookie']),
      ],
      env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
      // The agent starts in /; the sandbox's workdir is where its commands start (it may not exist yet).
      cwd: '/',
      capabilities: {
        bounding: agentCapabilities,
        effective: agentCapabilities,
        permitted: agentCapabilities,
      },
      noNewPrivileges: true,
    },
    root,
    hostname: 'sandbox',
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      {
        destination: '/dev',
        type: 'tmpfs',
        source: 'tmpfs',
        options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'],
      },
      {
        destination: '/dev/pts',
        type: 'devpts',
        source: 'devpts',
        options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', `max=${SANDBOX_MAX_PTYS}`],
      },
      {
        destination: '/dev/shm',
        type: 'tmpfs',
        source: 'shm',
        options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'],
      },
      {
        destination: '/dev/mqueue',
        type: 'mqueue',
        source: 'mqueue',
        options: ['nosuid', 'noexec', 'nodev'],
      },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      {
        destination: '/sys/fs/cgroup',
        type: 'cgroup',
        source: 'cgroup',
        options: ['nosuid', 'noexec', 'nodev', 'relatime', 'ro'],
      },
      {
        destination: AGENT_PATH_IN_SANDBOX,
        type: 'bind',
        source: agentHostPath,
        options: ['bind', 'ro', 'nosuid', 'nodev'],
      },
    ],
    linux: {
      namespaces: [
        { type: 'pid' },
        { type: 'network' },
        { type: 'ipc' },
        { type: 'uts' },
        { type: 'mount' },
        { type: 'cgroup' },
      ],
      cgroupsPath: cgroupsPath,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: limits.memoryBytes, swap: limits.memoryBytes },
        pids: { limit: limits.pids },
        cpu: { quota: limits.cpuQuotaUs, period: limits.cpuPeriodUs, shares: limits.cpuShares },
      },
      maskedPaths: MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
      seccomp: defaultSeccompProfile(),
    },
  };
}
