"""Weights -> code: routing rules, formulas, program assembly and verification.

    reader         extract(): every live module of a trained DT read as a rule or a formula
    routing_rules  hypothesis tests on pointer heads (offsets, positions, windowed / prefix extrema)
    equivalence    heads that fit no rule but whose misses change no output
    formulas       the simplest formula of a module's inputs (wtc.sr), decisions for integer outputs
    compose        sub-MLP and head composed into one formula per output
    readout        the model's modules and their values on fresh data
    program        the Program (an AST, its source, a vectorised call checked against its domain)
    domain         the inputs a program was read and verified on (Domain), written into its source
    verification   verify(): the program scored on fresh data, and against the model
"""
from wtc.extraction.domain import Domain
from wtc.extraction.formulas import ExtractionError, ExtractionTimeout
from wtc.extraction.program import Line, Program, ProgramDomainError, ProgramOutputError
from wtc.extraction.reader import Reading, extract
from wtc.extraction.verification import Verification, verify

__all__ = ["extract", "verify", "Program", "Line", "Verification", "Reading", "Domain", "ExtractionError",
           "ExtractionTimeout", "ProgramDomainError", "ProgramOutputError"]
