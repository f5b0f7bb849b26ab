"""Which tokens make each sample: the settings table, order and engine configuration, weight schedules, the
parallel mesh, and explaining a step from its position."""
