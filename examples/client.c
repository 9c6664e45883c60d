/* client.c — a luainfer msgpack-RPC client in C with msgpack-c and a socket.
 *
 *   cc examples/client.c $(pkg-config --cflags --libs msgpack) -o client
 *   ./client 127.0.0.1 7700 "The capital of France is"
 *
 * Sends [0, 1, "generate", {prompt, max_tokens, temperature = 0, stream = true}],
 * prints the text of each ["generate.delta", {...}] notification as it
 * arrives, then the finish reason from the response [1, 1, error, result].
 * Exit status: 0 on success, 1 on an error reply or I/O failure. */
#define _POSIX_C_SOURCE 200809L
#include <msgpack.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int dial(const char *host, const char *port) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static void pack_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* The value of key in a msgpack map, or NULL. */
static const msgpack_object *get(const msgpack_object *map, const char *key) {
    if (map->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
            !memcmp(k->via.str.ptr, key, k->via.str.size))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s HOST PORT PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    int fd = dial(argv[1], argv[2]);
    if (fd < 0) {
        perror("connect");
        return 1;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_int(&pk, 0); /* request */
    msgpack_pack_int(&pk, 1); /* msgid */
    pack_str(&pk, "generate");
    msgpack_pack_map(&pk, 4);
    pack_str(&pk, "prompt");
    pack_str(&pk, argv[3]);
    pack_str(&pk, "max_tokens");
    msgpack_pack_int(&pk, argc > 4 ? atoi(argv[4]) : 16);
    pack_str(&pk, "temperature");
    msgpack_pack_double(&pk, 0.0);
    pack_str(&pk, "stream");
    msgpack_pack_true(&pk);
    if (write(fd, sb.data, sb.size) != (ssize_t)sb.size) {
        perror("write");
        return 1;
    }
    msgpack_sbuffer_destroy(&sb);

    msgpack_unpacker up;
    msgpack_unpacker_init(&up, 65536);
    msgpack_unpacked msg;
    msgpack_unpacked_init(&msg);
    int status = 1;
    for (int done = 0; !done;) {
        msgpack_unpacker_reserve_buffer(&up, 65536);
        ssize_t n = read(fd, msgpack_unpacker_buffer(&up), 65536);
        if (n <= 0) {
            fprintf(stderr, "connection closed\n");
            break;
        }
        msgpack_unpacker_buffer_consumed(&up, (size_t)n);
        while (!done && msgpack_unpacker_next(&up, &msg) == MSGPACK_UNPACK_SUCCESS) {
            const msgpack_object *m = &msg.data;
            if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size < 3) continue;
            const msgpack_object *a = m->via.array.ptr;
            if (a[0].via.u64 == 2) { /* [2, "generate.delta", {text, ...}] */
                const msgpack_object *text = get(&a[2], "text");
                if (text && text->type == MSGPACK_OBJECT_STR) fwrite(text->via.str.ptr, 1, text->via.str.size, stdout);
                fflush(stdout);
            } else if (a[0].via.u64 == 1 && m->via.array.size == 4) { /* [1, msgid, error, result] */
                done = 1;
                if (a[2].type != MSGPACK_OBJECT_NIL) {
                    const msgpack_object *em = get(&a[2], "message");
                    fprintf(stderr, "\nerror: %.*s\n", em ? (int)em->via.str.size : 0, em ? em->via.str.ptr : "");
                } else {
                    const msgpack_object *fr = get(&a[3], "finish_reason");
                    printf("\n[finish: %.*s]\n", fr ? (int)fr->via.str.size : 0, fr ? fr->via.str.ptr : "?");
                    status = 0;
                }
            }
        }
    }
    msgpack_unpacked_destroy(&msg);
    msgpack_unpacker_destroy(&up);
    close(fd);
    return status;
}
