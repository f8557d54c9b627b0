"""A small terminal: replays what a live display wrote and returns the screen a user is left with.

It knows what rich's live display writes: text, newlines, carriage returns, cursor up/down (`ESC [ n A/B`),
erase in line (`ESC [ n K`), and ignores colours and cursor visibility. Lines scroll off nowhere: the
screen is as tall as the output.
"""

from __future__ import annotations

import re

CONTROL = re.compile(r"\x1b\[(\??)([0-9;]*)([A-Za-z])")


def final_screen(output: str) -> list[str]:
    """The lines on the screen once `output` has been written to a terminal, trailing blanks dropped."""
    lines: list[list[str]] = [[]]
    row = col = 0
    position = 0
    while position < len(output):
        match = CONTROL.match(output, position)
        if match:
            private, number, command = match.groups()
            count = int(number or 1) if number.isdigit() else 1
            if not private and command == "A":
                row = max(0, row - count)
            elif not private and command == "B":
                row += count
            elif not private and command == "K":
                line = lines[row]
                mode = int(number or 0)
                if mode == 2:
                    line.clear()
                elif mode == 0:
                    del line[col:]
            position = match.end()
            continue
        char = output[position]
        position += 1
        if char == "\n":
            row, col = row + 1, 0
        elif char == "\r":
            col = 0
        else:
            line = lines[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = char
            else:
                line.append(char)
            col += 1
        while len(lines) <= row:
            lines.append([])
    text = ["".join(line).rstrip() for line in lines]
    while text and not text[-1]:
        text.pop()
    return text
