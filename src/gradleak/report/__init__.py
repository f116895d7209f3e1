"""Turn pipeline metrics JSON files into CSV tables, deterministic figures, the paper
targets and a report."""

from gradleak.report.attribute import write_attribute_tables
from gradleak.report.figures import save_figure, write_figures
from gradleak.report.markdown import write_report
from gradleak.report.matched_utility import defense_directions
from gradleak.report.tables import write_csv, write_tables
from gradleak.report.target_data import TargetInputs, TargetResult
from gradleak.report.targets import load_target, write_target
from gradleak.report.verdicts import claims_table

__all__ = ["TargetInputs", "TargetResult", "claims_table", "defense_directions",
           "load_target", "save_figure", "write_attribute_tables", "write_csv",
           "write_figures", "write_report", "write_tables", "write_target"]
