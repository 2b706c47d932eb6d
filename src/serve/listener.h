// A listening TCP socket for marlhf's HTTP servers (serve, human-eval). Binding it
// ourselves, rather than through libmicrohttpd, gives the exact reason of a failure and
// lets port 0 pick any free port (the tests read the chosen port back).
#pragma once
#include <signal.h>
#include <stdbool.h>

// Listens on host:port (backlog `backlog`). Returns 0 with *fd and *ipv6 set, or -1 with
// err_set() naming --host / --port.
int listener_open(const char *host, int port, int backlog, int *fd, bool *ipv6);
// The port a listening socket is bound to, or -1.
int listener_port(int fd);
// Blocks SIGINT and SIGTERM in the calling thread (every thread started after inherits the
// mask, so only the caller's sigwait/sigtimedwait on *stop_signals sees them and shutdown
// happens on that thread, in order) and ignores SIGPIPE: a client that hangs up is an
// error on its socket, not the end of the server.
void listener_block_stop_signals(sigset_t *stop_signals);
