"""The gear planner: choose the gears from the requests a service sees (``gr.plan_gears``,
``gear-runtime plan``).

Every request runs on the cheapest gear that covers it (``execute(pad=True)``), so a gear
set costs, per request, the cost of the gear it lands on. The planner minimises the total
over a trace of requests with at most ``max_gears`` gears.

One module per concern, in the order the data flows:

* ``requests``: requests as an array and their structure (tied and constant values);
* ``trace``: reading a trace file (the formats ``gear-runtime plan --help`` documents);
* ``costs``: what a gear costs (input elements, a measured latency curve, a callable);
* ``measure``: the latency curve measured by compiling and benchmarking a ladder of gears;
* ``evaluate``: the plan report (:class:`GearPlan`) of a gear set on requests;
* ``search``: the search itself (exact dynamic programming, the several-value heuristic);
* ``plot``: the PNG; ``command``: ``gear-runtime plan``.
"""

from gear_runtime.tools.plan.costs import CostFn, LatencyCurve, elements_cost
from gear_runtime.tools.plan.evaluate import GearPlan, evaluate
from gear_runtime.tools.plan.measure import ladder_sizes, measure_latency
from gear_runtime.tools.plan.requests import Structure, as_requests, structure_of
from gear_runtime.tools.plan.search import plan_gears
from gear_runtime.tools.plan.trace import TraceLayout, layout_of, read_trace

__all__ = ["CostFn", "GearPlan", "LatencyCurve", "Structure", "TraceLayout", "as_requests",
           "elements_cost", "evaluate", "ladder_sizes", "layout_of", "measure_latency",
           "plan_gears", "read_trace", "structure_of"]
