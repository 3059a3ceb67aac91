"""The standard research workload of the targets of docs/performance.md, as cell sources.

The same cells run in a Kernos kernel (one cell per execute_request) and, for
the dill baseline, in a plain module's globals, so both hold exactly the same
namespace.  At ``scale=1.0`` the sizes are those of docs/performance.md:

* ``arr``: a 200 MB float64 numpy array (25M random values, so it does not
  compress, like real measurements);
* ``d``: a dict of 100k small dicts;
* ``df``: a 1M-row pandas DataFrame with three numeric columns;
* ``counter = 0``.

Then ten ``counter += 1`` cells, one 8-byte edit to the array, one field edit
in the dict and one cell edit in the frame.  Smaller scales shrink the three
large values proportionally (never below what the edits index).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARRAY_EDIT", "DICT_EDIT", "FRAME_EDIT", "Cell", "Workload"]

FULL_ARRAY_ELEMENTS = 25_000_000
FULL_DICT_ENTRIES = 100_000
FULL_FRAME_ROWS = 1_000_000
COUNTER_CELLS = 10

ARRAY_EDIT, DICT_EDIT, FRAME_EDIT = "array: 8-byte edit", "dict: one field", "frame: one cell"

ARRAY_INDEX = 12345
DICT_KEY = "k500"
FRAME_ROW = 1234


@dataclass(frozen=True)
class Cell:
    """One notebook cell of the workload."""

    kind: str
    """``setup``, ``counter`` or ``edit``: how the summary groups it."""
    label: str
    """A short name for the tables."""
    code: str


@dataclass(frozen=True)
class Workload:
    """The workload's sizes at one scale, and its cells."""

    scale: float
    array_elements: int
    dict_entries: int
    frame_rows: int

    @classmethod
    def at_scale(cls, scale: float) -> Workload:
        if scale <= 0:
            raise ValueError(f"the scale must be positive, not {scale}")
        return cls(
            scale=scale,
            array_elements=max(int(FULL_ARRAY_ELEMENTS * scale), ARRAY_INDEX + 1),
            dict_entries=max(int(FULL_DICT_ENTRIES * scale), int(DICT_KEY[1:]) + 1),
            frame_rows=max(int(FULL_FRAME_ROWS * scale), FRAME_ROW + 1),
        )

    @property
    def array_mb(self) -> float:
        return self.array_elements * 8 / 1e6

    def describe(self) -> str:
        return (f"arr: {self.array_elements:,} float64 ({self.array_mb:,.0f} MB), "
                f"d: {self.dict_entries:,} small dicts, df: {self.frame_rows:,} rows x 3, "
                f"counter, {COUNTER_CELLS} counter cells, 3 small edits")

    def setup_cells(self) -> list[Cell]:
        return [
            Cell("setup", "import numpy, pandas", "import numpy as np\nimport pandas as pd"),
            Cell("setup", f"arr = {self.array_mb:.0f} MB array",
                 f"arr = np.random.default_rng(0).random({self.array_elements})"),
            Cell("setup", f"d = {self.dict_entries / 1000:g}k dicts",
                 f"d = {{f'k{{i}}': {{'v': i, 'w': i * 0.5, 's': str(i)}} "
                 f"for i in range({self.dict_entries})}}"),
            Cell("setup", f"df = {self.frame_rows / 1e6:g}M-row frame",
                 "df = pd.DataFrame({\n"
                 f"    'a': np.arange({self.frame_rows}, dtype=np.int64),\n"
                 f"    'b': np.random.default_rng(1).random({self.frame_rows}),\n"
                 f"    'c': np.random.default_rng(2).standard_normal({self.frame_rows}),\n"
                 "})"),
            Cell("setup", "counter = 0", "counter = 0"),
        ]

    def counter_cells(self) -> list[Cell]:
        return [Cell("counter", f"counter += 1 (#{n})", "counter += 1")
                for n in range(1, COUNTER_CELLS + 1)]

    def edit_cells(self) -> list[Cell]:
        return [
            Cell("edit", ARRAY_EDIT, f"arr[{ARRAY_INDEX}] = 1.0"),
            Cell("edit", DICT_EDIT, f"d[{DICT_KEY!r}]['v'] = -1"),
            Cell("edit", FRAME_EDIT, f"df.iat[{FRAME_ROW}, 1] = -1.0"),
        ]

    def cells(self) -> list[Cell]:
        """Every cell of the workload, in order."""
        return self.setup_cells() + self.counter_cells() + self.edit_cells()

    def check_code(self) -> str:
        """A read-only cell that prints ``True`` if the namespace is the workload's end state."""
        return (
            "print(bool(\n"
            f"    counter == {COUNTER_CELLS}\n"
            f"    and arr.shape == ({self.array_elements},) and arr[{ARRAY_INDEX}] == 1.0\n"
            f"    and len(d) == {self.dict_entries} and d[{DICT_KEY!r}]['v'] == -1\n"
            f"    and d['k{self.dict_entries - 1}']['s'] == '{self.dict_entries - 1}'\n"
            f"    and df.shape == ({self.frame_rows}, 3) and df.iat[{FRAME_ROW}, 1] == -1.0\n"
            f"    and int(df['a'].iloc[-1]) == {self.frame_rows - 1}\n"
            "))"
        )
