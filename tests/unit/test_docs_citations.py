"""Code cites the project's own docs, and docs/pd-contract.md stays true to the code.

- No file under ``src/`` cites a document outside this repository (the shared reference or
  design notes: "reference §4.3", "behaviour A", "reference test case 12", "DESIGN §4").
- Every "docs/<page>.md §N" cited in ``src/``, ``tests/``, ``bench/``, ``README.md`` or
  ``docs/`` names a numbered section ("## N. …") that the page has, and no ``§`` in ``src/``
  stands outside such a citation. A citation stays on one line so that it can be checked.
- The error table of docs/pd-contract.md agrees with ``ERROR_CATALOGUE`` (status and retry
  flag), and lists every prefill/decode and multimodal code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tandem.errors import ERROR_CATALOGUE

REPO = Path(__file__).parents[2]
SRC = REPO / "src" / "tandem"
CONTRACT = REPO / "docs" / "pd-contract.md"

# Citations of documents that are not part of this repository.
OUTSIDE_CITATIONS = {
    "reference section": re.compile(r"\breference\s*§", re.IGNORECASE),
    "reference behaviour": re.compile(r"\bbehaviou?r [A-C]\b"),
    "reference test case": re.compile(r"\breference (?:test )?cases?\b", re.IGNORECASE),
    "design notes": re.compile(r"\bDESIGN(?:\.md)?\b"),
}
# "docs/pd-contract.md §3", "docs/pd-contract.md §7, §11", "docs/pd-contract.md §3 and §5".
CITATION = re.compile(r"\bdocs/([\w.-]+\.md) (§\d+(?:(?:, | and |–)§\d+)*)")
SECTION = re.compile(r"^## (\d+)\. \S", re.MULTILINE)


def _files(*roots: Path, suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found.extend(p for p in sorted(root.rglob("*")) if p.suffix in suffixes)
    return found


def _sections(page: Path) -> set[int]:
    return {int(n) for n in SECTION.findall(page.read_text())}


def _where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(REPO)}:{text.count(chr(10), 0, offset) + 1}"


def test_src_cites_no_document_outside_the_repository() -> None:
    hits = [
        f"{_where(path, text, m.start())}: {what}: {m.group(0)!r}"
        for path in _files(SRC)
        for text in [path.read_text()]
        for what, pattern in OUTSIDE_CITATIONS.items()
        for m in pattern.finditer(text)
    ]
    assert not hits, "\n".join(hits)


def test_src_has_no_section_sign_outside_a_docs_citation() -> None:
    hits = []
    for path in _files(SRC):
        text = path.read_text()
        # Blank out the valid citations, keeping offsets, and look for what is left.
        rest = CITATION.sub(lambda m: " " * len(m.group(0)), text)
        hits += [_where(path, text, m.start()) for m in re.finditer("§", rest)]
    assert not hits, "a § that is not a 'docs/<page>.md §N' citation:\n" + "\n".join(hits)


def test_contract_sections_are_numbered_one_to_n() -> None:
    numbers = [int(n) for n in SECTION.findall(CONTRACT.read_text())]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_every_docs_citation_names_an_existing_section() -> None:
    roots = (SRC, REPO / "tests", REPO / "bench", REPO / "docs", REPO / "README.md")
    bad: list[str] = []
    cited = 0
    for path in _files(*roots, suffixes=(".py", ".md")):
        text = path.read_text()
        for m in CITATION.finditer(text):
            page = REPO / "docs" / m.group(1)
            have = _sections(page) if page.is_file() else set()
            for number in re.findall(r"§(\d+)", m.group(2)):
                cited += 1
                if int(number) not in have:
                    bad.append(f"{_where(path, text, m.start())}: {m.group(0)!r}")
    assert cited, "no docs citation found at all: is the pattern still right?"
    assert not bad, "\n".join(bad)


def test_contract_refers_only_to_its_own_sections() -> None:
    text = CONTRACT.read_text()
    have = _sections(CONTRACT)
    # "§N" inside the page means its own section N (other pages are named with their path).
    missing = sorted({int(n) for n in re.findall(r"§(\d+)", text)} - have)
    assert not missing, missing


def _contract_error_rows() -> dict[str, tuple[int, bool]]:
    text = CONTRACT.read_text()
    table = text[text.index("## 19. Error codes") :]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \| (yes|no) \|", table, re.MULTILINE)
    return {code: (int(status), retried == "yes") for code, status, retried in rows}


def _is_pd_or_multimodal(code: str) -> bool:
    words = ("multimodal", "media", "pd_", "prefill", "decode")
    return any(w in code for w in words) or code in {"worker_error", "no_available_workers"}


def test_contract_error_table_lists_every_pd_and_multimodal_code() -> None:
    rows = _contract_error_rows()
    missing = [code for code in ERROR_CATALOGUE if _is_pd_or_multimodal(code) and code not in rows]
    assert not missing, missing


@pytest.mark.parametrize("code", sorted(_contract_error_rows()))
def test_contract_error_row_matches_the_catalogue(code: str) -> None:
    assert code in ERROR_CATALOGUE, f"{code} is not a catalogued code"
    spec = ERROR_CATALOGUE[code]
    assert _contract_error_rows()[code] == (spec.status, spec.retryable)
