# content of script.py
