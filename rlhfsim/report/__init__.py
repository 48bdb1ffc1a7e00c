"""Reports: terminal tables (text.py), plotly figures and HTML, Chrome trace."""
