// A listening TCP socket for marlhf's HTTP servers (serve, human-eval). Binding it
// ourselves, rather than through libmicrohttpd, gives the exact reason of a failure and
// lets port 0 pick any free port (the tests read the chosen port back).
#pragma once
#include <stdbool.h>

// Listens on host:port (backlog `backlog`). Returns 0 with *fd and *ipv6 set, or -1 with
// err_set() naming --host / --port.
int listener_open(const char *host, int port, int backlog, int *fd, bool *ipv6);
// The port a listening socket is bound to, or -1.
int listener_port(int fd);
