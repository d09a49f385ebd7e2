"""Weights -> code: routing rules, formulas, program assembly and verification."""
from wtc.extract.extract import Reading, extract
from wtc.extract.program import Line, Program
from wtc.extract.verify import Verification, verify

__all__ = ["extract", "verify", "Program", "Line", "Verification", "Reading"]
