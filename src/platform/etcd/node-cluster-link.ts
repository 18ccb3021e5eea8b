import type { Logger } from '../../common/index.ts';
import type { RunManager } from '../runs.ts';
import { connectEtcd, type EtcdClient, type EtcdOptions } from './etcd-connection.ts';
import { NodeMembership, type NodeRecord } from './node-membership.ts';
import { ProjectQuotaLedger } from './project-quota.ts';
import { followSharedRuns } from './shared-runs.ts';

/** How a node agent joins a cluster that keeps its state in etcd. */
export interface NodeEtcdOptions extends EtcdOptions {
  /** host:port controllers dial. Default: the listen address (loopback for 0.0.0.0) and its port. */
  advertise?: string;
  /** Seconds without a keepalive before etcd drops the node from placement. Default 10. */
  leaseTtlSeconds?: number;
}

/**
 * A node agent's part of the cluster in etcd: its membership record, the quota keys of its
 * sandboxes and the runs it follows, all on one connection.
 */
export class NodeClusterLink {
  private constructor(
    private readonly etcd: EtcdClient,
    private readonly membership: NodeMembership,
    readonly quota: ProjectQuotaLedger,
    private readonly runs: { close(): Promise<void> },
  ) {}

  /**
   * Registers the node, counts the sandboxes it already runs (adopted after a restart) against
   * their projects' quotas, and starts following the runs.
   */
  static async join(
    options: NodeEtcdOptions,
    record: NodeRecord,
    sandboxes: { id: string; project: string }[],
    runs: RunManager,
    logger: Logger,
  ): Promise<NodeClusterLink> {
    const etcd = await connectEtcd(options);
    try {
      const membership = await NodeMembership.join(etcd, record, options.leaseTtlSeconds ?? 10, logger);
      const quota = new ProjectQuotaLedger(etcd, membership, record.nodeId);
      const byProject = new Map<string, string[]>();
      for (const { id, project } of sandboxes)
        byProject.set(project, [...(byProject.get(project) ?? []), id]);
      for (const [project, ids] of byProject) await quota.hold(project, ...ids);
      const following = await followSharedRuns(etcd, runs, logger);
      logger.info({ endpoints: options.endpoints }, 'joined the cluster through etcd');
      return new NodeClusterLink(etcd, membership, quota, following);
    } catch (error) {
      etcd.close();
      throw error;
    }
  }

  /** Publishes the draining flag; without etcd right now, it goes out when the node rejoins. */
  async setDraining(draining: boolean, logger: Logger): Promise<void> {
    await this.membership
      .update({ draining })
      .catch((error: unknown) => logger.warn({ err: error }, 'etcd did not take the draining flag yet'));
  }

  /** Leaves the cluster at once: the record and the quota keys go with the lease. */
  async close(): Promise<void> {
    await this.runs.close();
    await this.membership.leave();
    this.etcd.close();
  }
}
