/* Who a file call acts as. A call with a user runs in a child of the agent made to be that user
 * (see handle_file in agent.c): the user's gid and groups, and the user's uid as its effective
 * (and so filesystem) uid, with no capabilities at all, so every check the kernel makes, modes as
 * much as procfs's and sysfs's checks of credentials and capabilities, is the user's. Its real
 * and saved uids stay 0, so no process of the user's may signal it, and it is not dumpable, so
 * none may trace it or open its memory. */
#define _GNU_SOURCE
#include "creds.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

bool creds_read_groups(mp_reader *r, const mp_item *array, creds *c) {
  bool ok = array->len <= CREDS_MAX_GROUPS;
  for (uint32_t i = 0; i < array->len; i++) {
    mp_item it;
    if (!mp_next(r, &it)) return false;
    if (it.type == MP_ARRAY || it.type == MP_MAP) {
      for (uint32_t k = 0; k < it.len * (it.type == MP_MAP ? 2u : 1u); k++) mp_skip(r);
      ok = false;
    } else if (it.type != MP_INT || it.i < 0 || it.i > 0xfffffffe) {
      ok = false;
    } else if (ok) {
      c->groups[i] = (gid_t)it.i;
    }
  }
  c->ngroups = ok ? array->len : 0;
  return ok;
}

bool creds_become(const creds *c) {
  if (c->gid < 0) {
    errno = EINVAL;
    return false;
  }
  if (setgroups(c->ngroups, c->groups) < 0 || setresgid((gid_t)c->gid, (gid_t)c->gid, (gid_t)c->gid) < 0) return false;
  /* the real and saved uids stay 0: no process of the user's may signal this one */
  if (setresuid(0, (uid_t)c->uid, 0) < 0) return false;
  /* the euid change emptied the effective set; empty the others too, so none can come back */
  struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct none[2];
  memset(none, 0, sizeof none);
  if (syscall(SYS_capset, &header, none) < 0) return false;
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  /* a credential change may make a process dumpable again (fs.suid_dumpable): never this one */
  if (prctl(PR_SET_DUMPABLE, 0) < 0) return false;
  if (geteuid() != (uid_t)c->uid || getegid() != (gid_t)c->gid) {
    errno = EPERM;
    return false;
  }
  return true;
}
