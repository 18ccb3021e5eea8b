/* File requests inside the sandbox root. */
#ifndef SANDGYM_FILES_H
#define SANDGYM_FILES_H

#include "msgpack.h"

#include <stdbool.h>

void files_init(void);
/* Takes the current root, after the host swapped it, as the one paths resolve in. */
bool files_reopen_root(void);
void file_read(uint32_t id, const mp_item *path, uint64_t max_bytes);
void file_write(uint32_t id, const mp_item *path, const mp_item *data, uint32_t mode);
void file_list(uint32_t id, const mp_item *path);
/* The agent's own write of a whole file (an absolute path), as file_write makes it, in folders
 * only root may change (else EPERM): 0 or an errno. */
int files_put(const char *path, const char *text, uint32_t mode);

#endif
