"""What the two SQL backends share: the column list, rows → StoredResponse, the chain's end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.gateway.history.codec import decoded
from tandem.gateway.history.store import BrokenChain, ChainTooLong, StoredResponse

# The order every SELECT below names them in; stored_from_row reads them by position.
COLUMNS = "tenant, id, previous_id, created_at, status, model, response, input_items"


def stored_from_row(row: Sequence[Any]) -> StoredResponse:
    tenant, response_id, previous_id, created_at, status, model, response, input_items = row[:8]
    return StoredResponse(
        id=response_id,
        tenant=tenant,
        previous_id=previous_id,
        created_at=float(created_at),
        status=status,
        model=model,
        response=decoded(response),
        input_items=decoded(input_items),
    )


def finish_chain(newest_first: Sequence[Sequence[Any]], max_turns: int) -> list[StoredResponse]:
    """The walk's rows (at most ``max_turns + 1``, newest first) → the turns, oldest first.

    One row more than ``max_turns`` means the conversation is too long; an oldest row that
    still names a previous turn means that turn is gone (deleted, expired or evicted).
    """
    if len(newest_first) > max_turns:
        raise ChainTooLong(max_turns)
    oldest_previous = newest_first[-1][2]
    if oldest_previous is not None:
        raise BrokenChain(oldest_previous)
    return [stored_from_row(row) for row in reversed(newest_first)]


def chain_sql(table: str, p: Sequence[str]) -> str:
    """The recursive walk from one response to the first turn, tenant-scoped and bounded.

    ``p`` spells the four parameters in the backend's style: tenant, id, expiry cut-off,
    max_turns. Depth 0 is the response asked for; the walk stops at depth ``max_turns``,
    one row past the limit, which is how "too long" is told apart from "complete".
    """
    tenant, response_id, cutoff, max_turns = p
    columns = ", ".join(f"r.{c.strip()}" for c in COLUMNS.split(","))
    return f"""
        WITH RECURSIVE walk(depth, {COLUMNS}) AS (
            SELECT 0, {columns} FROM {table} AS r
            WHERE r.tenant = {tenant} AND r.id = {response_id} AND r.created_at >= {cutoff}
            UNION ALL
            SELECT walk.depth + 1, {columns}
            FROM walk JOIN {table} AS r ON r.tenant = walk.tenant AND r.id = walk.previous_id
            WHERE walk.depth < {max_turns} AND r.created_at >= {cutoff}
        )
        SELECT {COLUMNS} FROM walk ORDER BY depth
    """


def evict_sql(tables: tuple[str, str], cap: str, per_tenant: bool = False) -> tuple[str, str]:
    """The two DELETEs (responses, then conversations) that take the oldest rows while all
    rows together (``per_tenant``: one tenant's rows) are over ``cap`` bytes.

    Responses and conversations are ranked as one list (a conversation's age is its last
    change), so one cap weighs both. Summing sizes from the newest row down, every row
    from the one that crosses the cap on is deleted: the same rows as deleting oldest-first
    until the total fits. Per tenant the sum restarts for each tenant (``PARTITION BY``),
    so a tenant within its cap loses no row however much another one stored. The second
    DELETE re-ranks without the responses the first took, so it may keep a conversation
    the first ranking would have taken: the total is under the cap either way.
    A conversation's items go after these (``sqlconv.ORPHANS``).
    """
    responses, conversations = tables
    order = (
        "PARTITION BY tenant ORDER BY age DESC, id DESC"
        if per_tenant
        else "ORDER BY age DESC, tenant DESC, id DESC"
    )
    ranked = f"""
        SELECT kind, tenant, id, SUM(size_bytes) OVER (
            {order}
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
        ) AS kept
        FROM (
            SELECT 'r' AS kind, tenant, id, created_at AS age, size_bytes FROM {responses}
            UNION ALL
            SELECT 'c' AS kind, tenant, id, updated_at AS age, size_bytes FROM {conversations}
        ) AS everything
    """

    def delete(table: str, kind: str) -> str:
        return f"""
            DELETE FROM {table} WHERE (tenant, id) IN (
                SELECT tenant, id FROM ({ranked}) AS ranked
                WHERE kept > {cap} AND kind = '{kind}'
            )
        """

    return delete(responses, "r"), delete(conversations, "c")
