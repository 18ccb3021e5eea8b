/**
 * The little of DNS wire format (RFC 1035) the sandbox resolver relay reads: one question of a
 * query a sandbox sent (every byte of which the agent chose), and the head and question of the
 * upstream's answer. Nothing here throws or loops on what it is given: a name is read label by
 * label within the packet, compression pointers are refused (a query has no reason to carry one),
 * and every length is checked before it is used.
 */

/** The largest query the relay reads, and the payload size it asks the upstream for (EDNS). */
export const MAX_DNS_PACKET = 1232;
const HEADER = 12;
const MAX_LABEL = 63;
const MAX_NAME_WIRE = 255;

export const RCODE = { formErr: 1, servFail: 2, nxDomain: 3, refused: 5 } as const;

/** A question: its name on the wire (labels and the root), and the same as text. */
export interface DnsQuestion {
  wire: Buffer;
  /** Presentation form, lower case; bytes outside `a-z0-9-_` written `\DDD`. */
  name: string;
  type: number;
  class: number;
}

export interface DnsQuery {
  id: number;
  /** Recursion desired. */
  rd: boolean;
  question: DnsQuestion;
}

export interface DnsAnswerHead {
  id: number;
  rcode: number;
  question: DnsQuestion;
}

/** A standard query with exactly one question, or undefined for anything else. */
export function parseQuery(packet: Buffer): DnsQuery | undefined {
  if (packet.length < HEADER || packet.length > MAX_DNS_PACKET) return undefined;
  const flags = packet.readUInt16BE(2);
  const isResponse = (flags & 0x8000) !== 0;
  const opcode = (flags >> 11) & 0xf;
  if (isResponse || opcode !== 0) return undefined;
  // one question; no answers or authority in a query (an EDNS record in additional is fine)
  if (packet.readUInt16BE(4) !== 1 || packet.readUInt16BE(6) !== 0 || packet.readUInt16BE(8) !== 0)
    return undefined;
  const question = parseQuestion(packet);
  return question && { id: packet.readUInt16BE(0), rd: (flags & 0x0100) !== 0, question };
}

/** The id, response code and question of an answer, or undefined if it is not one. */
export function parseAnswerHead(packet: Buffer): DnsAnswerHead | undefined {
  if (packet.length < HEADER) return undefined;
  const flags = packet.readUInt16BE(2);
  if ((flags & 0x8000) === 0 || packet.readUInt16BE(4) !== 1) return undefined;
  const question = parseQuestion(packet);
  return question && { id: packet.readUInt16BE(0), rcode: flags & 0xf, question };
}

function parseQuestion(packet: Buffer): DnsQuestion | undefined {
  const labels: string[] = [];
  let at = HEADER;
  for (;;) {
    if (at >= packet.length) return undefined;
    const length = packet[at]!;
    // 0xC0: a compression pointer; 0x40 and 0x80: label types nobody uses
    if (length > MAX_LABEL) return undefined;
    if (at + 1 + length - HEADER > MAX_NAME_WIRE) return undefined;
    if (length === 0) break;
    if (at + 1 + length > packet.length) return undefined;
    labels.push(labelText(packet.subarray(at + 1, at + 1 + length)));
    at += 1 + length;
  }
  const end = at + 1;
  if (end + 4 > packet.length) return undefined;
  return {
    wire: Buffer.from(packet.subarray(HEADER, end)),
    name: labels.length ? labels.join('.') : '.',
    type: packet.readUInt16BE(end),
    class: packet.readUInt16BE(end + 2),
  };
}

/** A label's bytes as text a report can show: a byte that could mislead a reader is escaped. */
function labelText(bytes: Buffer): string {
  let text = '';
  for (const byte of bytes) {
    const lower = byte >= 0x41 && byte <= 0x5a ? byte + 0x20 : byte;
    const plain =
      (lower >= 0x61 && lower <= 0x7a) ||
      (lower >= 0x30 && lower <= 0x39) ||
      lower === 0x2d ||
      lower === 0x5f;
    text += plain ? String.fromCharCode(lower) : `\\${String(byte).padStart(3, '0')}`;
  }
  return text;
}

/** Whether two questions ask the same (names compared without case, as DNS does). */
export function sameQuestion(a: DnsQuestion, b: DnsQuestion): boolean {
  return a.name === b.name && a.type === b.type && a.class === b.class;
}

/**
 * A query of our own for `question`: one question and an EDNS record offering
 * {@link MAX_DNS_PACKET} bytes, and nothing else of what the sandbox sent.
 */
export function buildQuery(id: number, question: DnsQuestion, rd: boolean): Buffer {
  const header = Buffer.alloc(HEADER);
  header.writeUInt16BE(id, 0);
  header.writeUInt16BE(rd ? 0x0100 : 0, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(1, 10); // the OPT record
  const tail = Buffer.alloc(4);
  tail.writeUInt16BE(question.type, 0);
  tail.writeUInt16BE(question.class, 2);
  const opt = Buffer.alloc(11);
  opt.writeUInt16BE(41, 1); // root name, type OPT
  opt.writeUInt16BE(MAX_DNS_PACKET, 3);
  return Buffer.concat([header, question.wire, tail, opt]);
}

/** An answer with no records and `rcode`, for `query`'s question: never larger than the query. */
export function emptyAnswer(query: DnsQuery, rcode: number): Buffer {
  const header = Buffer.alloc(HEADER);
  header.writeUInt16BE(query.id, 0);
  header.writeUInt16BE(0x8000 | (query.rd ? 0x0100 : 0) | rcode, 2);
  header.writeUInt16BE(1, 4);
  const tail = Buffer.alloc(4);
  tail.writeUInt16BE(query.question.type, 0);
  tail.writeUInt16BE(query.question.class, 2);
  return Buffer.concat([header, query.question.wire, tail]);
}
