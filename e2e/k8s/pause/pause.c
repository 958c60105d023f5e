/*
 * pause: the sandbox process of a pod, for the node e2e tests' image
 * registry.k8s.io/pause (k8s.sh images builds it with gcc -static -Os).
 * It holds the pod's namespaces and does nothing: it sleeps in pause()
 * until SIGINT or SIGTERM, then exits 0. As PID 1 of a pod that shares its
 * PID namespace, it reaps the zombies re-parented to it on SIGCHLD.
 * -v prints the version and exits.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10.1"

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static void on(int sig, void (*handler)(int))
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
	if (sigaction(sig, &sa, NULL) < 0) {
		perror("pause: sigaction");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "-v") == 0) {
		printf("pause.c %s\n", VERSION);
		return 0;
	}
	if (argc != 1) {
		fprintf(stderr, "usage: pause [-v]\n");
		return 2;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not PID 1\n");
	on(SIGINT, on_term);
	on(SIGTERM, on_term);
	on(SIGCHLD, on_child);
	for (;;)
		pause();
	return 1; /* not reached */
}
