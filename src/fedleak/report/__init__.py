"""Turn pipeline metrics JSON files into CSV tables, deterministic figures and a report."""

from fedleak.report.figures import save_figure, write_figures
from fedleak.report.markdown import write_report
from fedleak.report.tables import write_tables

__all__ = ["save_figure", "write_figures", "write_report", "write_tables"]
