"""The gear planner (``gr.plan_gears``, ``gear-runtime plan``)."""
