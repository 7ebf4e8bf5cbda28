"""How the run list pages: by cursor, newest first, and a cursor that is not ours is a 400."""

from __future__ import annotations

from rest_framework.exceptions import NotFound, ParseError
from rest_framework.pagination import Cursor, CursorPagination

from ..columns import holds_an_id


def a_run_position(position: object) -> bool:
    """Whether a cursor's position can be compared with run ids on every database.

    REST framework decodes the position as a str (its stubs say int): either is checked as text.
    """
    if position is None:
        return True
    return holds_an_id(str(position))


class RunCursorPagination(CursorPagination):
    """Newest runs first by id: unique and unchanging, so pages hold still while runs arrive."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    invalid_cursor_message = "Invalid cursor: follow the next and previous links as given."

    def decode_cursor(self, request) -> Cursor | None:
        # REST framework answers 404 to a cursor it cannot decode, and passes any position it
        # can decode on to the query (a 500 when it is not a number the database can compare).
        try:
            cursor = super().decode_cursor(request)
        except NotFound as exc:
            raise ParseError(self.invalid_cursor_message) from exc
        if cursor is not None and not a_run_position(cursor.position):
            raise ParseError(self.invalid_cursor_message)
        return cursor
