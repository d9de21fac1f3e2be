/* Redis replies: a server on 127.0.0.1 (a thread of this process) answers every MGET with the
 * fuzzed bytes and closes the connection; the source decodes them (RESP through hiredis,
 * then the record checks) into a batch, whose records are read back. A reply may be
 * anything: the fetch fails with a status or returns records that read back consistently.
 * Input: ids to fetch (1 + byte0 % 8), keys per MGET (1 + byte1 % 4), slots (byte2 % 4),
 * then the reply bytes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz.h"

static int port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *reply; /* a copy: the server may still answer a connection of an earlier input */
static size_t reply_len;

static void *serve(void *arg)
{
    int ls = *(int *)arg;
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) continue;
        char req[65536];
        if (recv(c, req, sizeof req, 0) > 0) { /* the MGET(s): answer with the fuzzed bytes */
            pthread_mutex_lock(&mu);
            for (size_t done = 0; done < reply_len;) {
                ssize_t w = send(c, reply + done, reply_len - done, MSG_NOSIGNAL);
                if (w <= 0) break;
                done += (size_t)w;
            }
            pthread_mutex_unlock(&mu);
        }
        close(c);
    }
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static int ls;
    ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 16) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        abort();
    port = ntohs(a.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, &ls)) abort();
    pthread_detach(t);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    size_t n = 1 + data[0] % 8;
    int32_t slots = data[2] % 4;
    pthread_mutex_lock(&mu);
    free(reply);
    reply_len = size - 3;
    reply = malloc(reply_len + 1);
    if (reply) memcpy(reply, data + 3, reply_len);
    else reply_len = 0;
    pthread_mutex_unlock(&mu);
    flame_redis_options o = {.struct_size = sizeof o, .host = "127.0.0.1", .port = port, .num_slots = slots,
                             .connect_timeout_ms = 1000, .read_timeout_ms = 1000, .keys_per_command = 1 + data[1] % 4,
                             .backoff_min_ms = 1, .backoff_max_ms = 1};
    flame_feature_source *src = NULL;
    flame_status st = flame_feature_source_create_redis(&o, &src);
    FZ_ASSERT(st == FLAME_OK, "cannot reach the in-process server: %s", flame_last_error());
    int64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    flame_feature_batch *b = NULL;
    FZ_ASSERT(flame_feature_batch_create(slots, &b) == FLAME_OK, "%s", flame_last_error());
    st = flame_feature_source_fetch(src, ids, n, b);
    FZ_CHECK_ERROR(st);
    if (st == FLAME_OK) {
        for (size_t i = 0; i < n; i++)
            for (int32_t s = 0; s < slots; s++) {
                int found = 0;
                const int64_t *p = NULL;
                size_t cnt = 0;
                FZ_ASSERT(flame_feature_batch_get_slot(b, i, s, &found, &p, &cnt) == FLAME_OK, "record %zu: %s", i,
                          flame_last_error());
                fz_touch(p, cnt * sizeof *p);
            }
    }
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(src);
    return 0;
}
