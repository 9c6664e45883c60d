/* test_policy_evict.c — the evict hook: policies/lfu.lua's exact order, and
 * garbage answers that the engine must survive (ids ignored, errors). */
#include "policy/policy_lua.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

int main(void) {
    li_error err = {0};
    li_policy *p;
    const char *dir = getenv("LUAINFER_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/policies/lfu.lua", dir ? dir : ".");
    CHECK(li_policy_lua_open(&p, path, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(p->has_evict && p->has_schedule, "lfu.lua has evict and schedule");
    /* block, last_access, hits, depth */
    li_evict_candidate c[] = {
        {10, 5.0, 3, 0}, {11, 1.0, 0, 2}, {12, 2.0, 0, 1}, {13, 2.0, 0, 3}, {14, 0.5, 1, 0}, {15, 9.0, 0, 0},
    };
    int32_t order[6], n = 0;
    CHECK(p->ops->evict(p, c, 6, 6, order, &n, &err) == 0, "%s", err.msg);
    /* hits 0 first by last_access (11@1.0, then 13 and 12 @2.0: deeper first, then 15@9.0), then 14 (1 hit), 10 */
    int32_t want[6] = {11, 13, 12, 15, 14, 10};
    CHECK(n == 6 && !memcmp(order, want, sizeof want), "LFU order %d %d %d %d %d %d", order[0], order[1], order[2],
          order[3], order[4], order[5]);
    CHECK(p->ops->evict(p, c, 6, 2, order, &n, &err) == 0 && n == 2 && order[0] == 11 && order[1] == 13,
          "need=2 gives the two most evictable");
    p->ops->free(p);

    /* a policy without evict: has_evict false (the engine keeps LRU) */
    CHECK(li_policy_lua_open(&p, "x.lua", "return { schedule = function(s) return {} end }", NULL, &err) == 0, "%s",
          err.msg);
    CHECK(!p->has_evict, "no evict hook");
    p->ops->free(p);

    /* garbage: non-numbers, fractions, negatives are skipped; errors reported */
    CHECK(li_policy_lua_open(&p, "g.lua",
                             "return { evict = function(c, n) return { 'x', 1.5, -3, {}, c[2].block, 1e12 } end }",
                             NULL, &err) == 0,
          "%s", err.msg);
    CHECK(p->ops->evict(p, c, 6, 3, order, &n, &err) == 0 && n == 1 && order[0] == 11, "only the valid id kept (%d)", n);
    p->ops->free(p);
    CHECK(li_policy_lua_open(&p, "e.lua", "return { evict = function(c, n) error('nope') end }", NULL, &err) == 0,
          "%s", err.msg);
    CHECK(p->ops->evict(p, c, 6, 3, order, &n, &err) != 0 && n == 0 && strstr(err.msg, "nope"), "error surfaces: %s",
          err.msg);
    p->ops->free(p);
    CHECK(li_policy_lua_open(&p, "e2.lua", "return { evict = function(c, n) return 7 end }", NULL, &err) == 0, "%s",
          err.msg);
    CHECK(p->ops->evict(p, c, 6, 3, order, &n, &err) != 0 && strstr(err.msg, "list"), "non-table: %s", err.msg);
    p->ops->free(p);
    return t_summary("policy_evict");
}
