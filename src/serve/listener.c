#include "serve/listener.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/check.h"

int listener_open(const char *host, int port, int backlog, int *fd_out, bool *ipv6) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    int rc = getaddrinfo(host, service, &hints, &list);
    if (rc != 0) return err_set("cannot resolve host '%s': %s (--host)", host, gai_strerror(rc));
    int saved = 0;
    for (struct addrinfo *a = list; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
            *fd_out = fd;
            *ipv6 = a->ai_family == AF_INET6;
            freeaddrinfo(list);
            return 0;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(list);
    return err_set("cannot listen on %s:%d: %s (--host, --port)", host, port, strerror(saved));
}

int listener_port(int fd) {
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    if (getsockname(fd, (struct sockaddr *)&address, &length) != 0) return -1;
    if (address.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&address)->sin6_port);
    return ntohs(((struct sockaddr_in *)&address)->sin_port);
}

void listener_block_stop_signals(sigset_t *stop_signals) {
    sigemptyset(stop_signals);
    sigaddset(stop_signals, SIGINT);
    sigaddset(stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
}
