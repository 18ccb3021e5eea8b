import { request } from 'node:http';

/**
 * A client of the Docker Engine API over its unix socket: what an RL harness's Docker SDK does
 * (create, start, exec, remove), with no CLI process per call. Podman serves the same API
 * (`podman system service`), so one client drives both.
 */
export class EngineApi {
  constructor(
    readonly name: string,
    private readonly socket: string,
  ) {}

  /** One API call; the JSON it answers, or a clear error with the engine's message. */
  async call<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    const text = await this.callText(method, path, body);
    return (text && /^\s*[[{]/.test(text) ? JSON.parse(text) : text) as T;
  }

  /** One API call; the text it answers (a stream of JSON lines for a build), or a clear error. */
  private async callText(method: string, path: string, body?: unknown): Promise<string> {
    const payload =
      body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const { status, data } = await new Promise<{ status: number; data: Buffer }>((resolve, reject) => {
      const call = request(
        {
          socketPath: this.socket,
          path,
          method,
          headers: {
            'content-type': Buffer.isBuffer(body) ? 'application/x-tar' : 'application/json',
            ...(payload ? { 'content-length': payload.length } : {}),
          },
        },
        (response) => {
          const chunks: Buffer[] = [];
          response.on('data', (chunk: Buffer) => chunks.push(chunk));
          response.on('end', () =>
            resolve({ status: response.statusCode ?? 0, data: Buffer.concat(chunks) }),
          );
          response.on('error', reject);
        },
      );
      call.on('error', reject);
      call.end(payload);
    });
    if (status >= 400) throw new Error(`${this.name} ${method} ${path}: ${status} ${data.toString().trim()}`);
    return data.toString();
  }

  async ping(): Promise<boolean> {
    return (await this.call<string>('GET', '/_ping').catch(() => '')) === 'OK';
  }

  /** Imports a root file system tarball as `repo:tag`. */
  async importImage(tar: Buffer, repo: string, tag: string): Promise<void> {
    await this.call('POST', `/images/create?fromSrc=-&repo=${repo}&tag=${tag}`, tar);
  }

  /**
   * Builds the Dockerfile at the root of a context tarball as `tag`, from local images only. A
   * failed step answers 200 with an `error` line in the stream, which is turned into a throw.
   */
  async build(context: Buffer, tag: string, dockerfile = 'Dockerfile'): Promise<void> {
    const query = `t=${encodeURIComponent(tag)}&dockerfile=${encodeURIComponent(dockerfile)}&rm=1&forcerm=1`;
    const stream = await this.callText('POST', `/build?${query}`, context);
    for (const line of stream.split('\n')) {
      if (!line.trim().startsWith('{')) continue;
      const message = JSON.parse(line) as { error?: string };
      if (message.error) throw new Error(`${this.name} build of ${tag}: ${message.error.trim()}`);
    }
  }

  /** Unpacks a tarball into a container at `path`. */
  async putArchive(id: string, path: string, tar: Buffer): Promise<void> {
    await this.callText('PUT', `/containers/${id}/archive?path=${encodeURIComponent(path)}`, tar);
  }

  /** Creates and starts an idle container without a network; its id. */
  async run(image: string, options: { memoryMib?: number; cpus?: number } = {}): Promise<string> {
    const { Id } = await this.call<{ Id: string }>('POST', '/containers/create', {
      Image: image,
      Cmd: ['/bin/sleep', '1000000'],
      NetworkDisabled: true,
      HostConfig: {
        NetworkMode: 'none',
        // the same limits on every engine, within this host's (podman's defaults are above them)
        Ulimits: [
          { Name: 'nofile', Soft: 1024, Hard: 1024 },
          { Name: 'nproc', Soft: 1024, Hard: 1024 },
        ],
        ...(options.memoryMib ? { Memory: options.memoryMib * 1024 * 1024 } : {}),
        ...(options.cpus ? { NanoCpus: Math.round(options.cpus * 1e9) } : {}),
      },
    });
    await this.call('POST', `/containers/${Id}/start`);
    return Id;
  }

  /** Runs a command in a container to its end; its exit code. */
  async exec(id: string, command: string[]): Promise<number> {
    const { Id } = await this.call<{ Id: string }>('POST', `/containers/${id}/exec`, {
      Cmd: command,
      AttachStdout: true,
      AttachStderr: true,
    });
    // attached, the answer ends when the command does
    await this.call('POST', `/exec/${Id}/start`, { Detach: false, Tty: false });
    const { ExitCode } = await this.call<{ ExitCode: number }>('GET', `/exec/${Id}/json`);
    return ExitCode;
  }

  async remove(id: string): Promise<void> {
    await this.call('DELETE', `/containers/${id}?force=true&v=true`);
  }

  /** Every container of this engine, running or not. */
  async containers(): Promise<string[]> {
    return (await this.call<{ Id: string }[]>('GET', '/containers/json?all=true')).map((c) => c.Id);
  }
}
