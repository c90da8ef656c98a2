"""Text the lock shows people: one line, no invisible characters, a sane length, HTML-safe where it must be.

The sandbox output pane renders HTML (Quali's own shells write ``<font color=...>`` there), and much of what
the lock writes comes from outside: owner labels and ``Mutex Owner`` values written by other code, a Force
Release reason typed by a person. :func:`one_line` makes any such value one line of visible text: control,
line-separator, bidi and other format characters (zero-width spaces among them) removed, whitespace collapsed,
cut to a length. :func:`output_line` does that to a whole message and escapes it for the output pane; only the
styling it adds itself (a warning's colour) is markup. :meth:`~.alias.LockAlias.write_output`, the single
place the lock writes to the output, calls it.
"""

from __future__ import annotations

import html
import re
import unicodedata

#: The longest line the lock writes to the sandbox output (characters, before escaping).
MAX_OUTPUT_LENGTH = 1000
#: The longest single value from outside (a label, an owner token, an attribute value) shown in a message.
MAX_VALUE_LENGTH = 200
#: How a warning stands out in the output pane: the colour Quali's configuration shells use for theirs.
WARNING_TEMPLATE = '<font color="#f48342">WARNING: {}</font>'

_ELLIPSIS = "..."
_SPACES = re.compile(r"\s+")
#: Unicode categories never shown: controls (Cc), format characters (Cf: bidi overrides, zero-width
#: spaces, the BOM), line and paragraph separators (Zl, Zp), lone surrogates (Cs) and unassigned code
#: points (Cn, which include the noncharacters XML cannot carry).
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})


def one_line(value: object, limit: int = MAX_VALUE_LENGTH) -> str:
    """``value`` as one line of visible text of at most ``limit`` characters ("" when none is left).

    Invisible characters go, each run of whitespace (tabs and line breaks too) becomes one space, and a longer
    text is cut and ends with ``...``. No escaping: that is for the place the text is shown in.
    """
    text = "".join(" " if ch.isspace() else ch for ch in str(value) if _visible(ch))
    text = _SPACES.sub(" ", text).strip()
    if len(text) > limit:
        text = text[: max(0, limit - len(_ELLIPSIS))].rstrip() + _ELLIPSIS
    return text


def output_line(message: object, warning: bool = False, limit: int = MAX_OUTPUT_LENGTH) -> str:
    """A message as the sandbox output pane gets it: :func:`one_line` (at most ``limit`` characters), then
    HTML-escaped, so nothing in it is markup; a ``warning`` is then wrapped in the warning style."""
    text = html.escape(one_line(message, limit), quote=False)
    return WARNING_TEMPLATE.format(text) if warning else text


def html_text(text: str) -> str:
    """Several lines (each already made safe with :func:`one_line`) escaped for a pane that renders HTML."""
    return html.escape(text, quote=False)


def _visible(ch: str) -> bool:
    if ch in "\t\n\r":  # whitespace that becomes a space rather than vanishing
        return True
    return unicodedata.category(ch) not in _INVISIBLE
