"""Traces: the JSONL formats (lockstep traces and manager event logs), the checker that
replays an event log on the model, and the recorder that writes workloads as logs."""

from kvpocket.verify.traces.record import Workload
from kvpocket.verify.traces.trace import Trace, TraceError, TraceStep, parse_trace, read_trace, write_trace
from kvpocket.verify.traces.tracecheck import TraceVerdict, check_events

__all__ = ["Trace", "TraceError", "TraceStep", "TraceVerdict", "Workload", "check_events",
           "parse_trace", "read_trace", "write_trace"]
