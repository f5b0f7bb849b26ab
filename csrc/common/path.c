/*
 * path.c — what kind of path a string names. Shared by the sources layer
 * (which hands URLs to whichever byte provider opened them) and the remote
 * stack.
 */
#include <string.h>

#include "internal.h"

int tf__is_url(const char *path) {
    if (!path) return 0;
    const char *p = strstr(path, "://");
    if (!p || p == path) return 0;
    for (const char *s = path; s < p; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '+' ||
              *s == '-' || *s == '.'))
            return 0;
    return strncmp(path, "file://", 7) != 0;
}
