/* The agent's own process state: OOM protection, what its commands give up, and a fingerprint. */
#ifndef SANDGYM_SELFSTATE_H
#define SANDGYM_SELFSTATE_H

#include <stddef.h>

/* The agent: never the OOM killer's pick (needs CAP_SYS_RESOURCE; best effort without it). */
void selfstate_protect(void);
/* A command, in its child before exec: the OOM killer's first pick for good, without the
 * capability to change that. */
void selfstate_for_command(void);
/* The agent's state that other processes of its uid can change, as text; returns its length. */
size_t selfstate_describe(char *buf, size_t size);
/* Processes of the agent's pid namespace besides itself, as /proc lists them; -1 if unreadable. */
int selfstate_others(void);

#endif
