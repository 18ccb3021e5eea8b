/* Filesystem credentials around one file call. The agent serves one request at a time from one
 * thread, so switching its own fsuid, fsgid and groups for the call is safe and costs four
 * system calls (a child that drops to the user would cost a fork). While the fsuid is not 0 the
 * kernel takes the filesystem capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_FSETID…)
 * out of the effective set, so opens, the folders a write makes, its temp file and its rename are
 * checked as the user's and what they create is the user's. The real and saved uids stay 0, so no
 * process of the sandbox may signal or trace the agent meanwhile, and the fsuid change keeps it
 * not dumpable. */
#define _GNU_SOURCE
#include "creds.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <unistd.h>

static gid_t own_groups[CREDS_MAX_GROUPS];
static int own_ngroups;

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

bool creds_enter_fs(const creds *c) {
  if (c->uid < 0) return true;
  own_ngroups = getgroups(CREDS_MAX_GROUPS, own_groups);
  if (own_ngroups < 0) return false;
  if (setgroups(c->ngroups, c->groups) < 0) return false;
  setfsgid((gid_t)c->gid);
  setfsuid((uid_t)c->uid);
  /* both calls answer with the previous id whether or not they worked: ask again */
  if ((gid_t)setfsgid((gid_t)-1) == (gid_t)c->gid && (uid_t)setfsuid((uid_t)-1) == (uid_t)c->uid) return true;
  creds_leave_fs(c);
  errno = EPERM;
  return false;
}

void creds_leave_fs(const creds *c) {
  if (c->uid < 0) return;
  setfsuid(0);
  setfsgid(0);
  if (setfsuid((uid_t)-1) != 0 || setfsgid((gid_t)-1) != 0 || setgroups((size_t)own_ngroups, own_groups) < 0) {
    dprintf(2, "sandgym-agent: cannot take back root's credentials after a file call\n");
    _exit(113);
  }
}
