"""Turn pipeline metrics JSON files into CSV tables, deterministic figures, the paper
targets and a report."""

from fedleak.report.attribute import write_attribute_tables
from fedleak.report.figures import save_figure, write_figures
from fedleak.report.markdown import write_report
from fedleak.report.matched_utility import defense_directions
from fedleak.report.tables import write_csv, write_tables
from fedleak.report.targets import TargetInputs, TargetResult, load_target, write_target
from fedleak.report.verdicts import claims_table

__all__ = ["TargetInputs", "TargetResult", "claims_table", "defense_directions",
           "load_target", "save_figure", "write_attribute_tables", "write_csv",
           "write_figures", "write_report", "write_tables", "write_target"]
