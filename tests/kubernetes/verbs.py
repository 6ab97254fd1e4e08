"""The RBAC verb each request action kmock records stands for (a Role is compared in verbs)."""

from __future__ import annotations

from kmock import action

VERB_OF = {
    action.FETCH: "get",
    action.LIST: "list",
    action.WATCH: "watch",
    action.CREATE: "create",
    action.UPDATE: "patch",
    action.DELETE: "delete",
}
