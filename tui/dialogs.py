"""Modal dialogs of the TUI: confirm, input, result, help."""

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Static

from diag.fields import FIELDS, RUNTIME_FIELD_ROWS
from tui.widgets import fill_table



class ConfirmDialog(ModalScreen):
    """Yes/no question; dismisses with True or False."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question, yes="Yes"):
        super().__init__(classes="dialog")
        self.question, self.yes = question, yes

    def compose(self):
        with Vertical(id="dialog"):
            yield Static(Text(self.question), id="question")
            with Horizontal(id="buttons"):
                yield Button(self.yes, id="yes", variant="warning")
                yield Button("No", id="no")

    def on_mount(self):
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event):
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value):
        self.dismiss(value)


class InputDialog(ModalScreen):
    """One line of input; dismisses with the text, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, prompt, value="", placeholder=""):
        super().__init__(classes="dialog")
        self.prompt, self.value, self.placeholder = prompt, value, placeholder

    def compose(self):
        with Vertical(id="dialog"):
            yield Static(Text(self.prompt), id="question")
            yield Input(value=self.value, placeholder=self.placeholder, id="answer")
            yield Static("enter: ok · escape: cancel", classes="hint")

    def on_mount(self):
        self.query_one(Input).focus()

    def on_input_submitted(self, event):
        self.dismiss(event.value)

    def action_cancel(self):
        self.dismiss(None)


class ResultDialog(ModalScreen):
    """A small table of results (release before/after)."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close")]

    def __init__(self, title, columns, rows):
        super().__init__(classes="dialog")
        self.title_text, self.columns, self.rows = title, columns, rows

    def compose(self):
        with Vertical(id="dialog"):
            yield Static(Text(self.title_text), id="question")
            yield DataTable(id="result", cursor_type="none")
            yield Static("enter / escape: close", classes="hint")

    def on_mount(self):
        fill_table(self.query_one("#result", DataTable), self.columns, self.rows,
                   right=(1, 2, 3))

    def action_close(self):
        self.dismiss(None)


class HelpScreen(ModalScreen):
    """Keys of the screen underneath, and the meaning of every number."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, bindings):
        super().__init__(classes="dialog")
        self.bindings_list = bindings

    def compose(self):
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        for key, desc in self.bindings_list:
            keys.add_row(key, desc)
        glossary = Table.grid(padding=(0, 2))
        glossary.add_column(style="bold", no_wrap=True)
        glossary.add_column()
        for f in FIELDS + RUNTIME_FIELD_ROWS:
            glossary.add_row(f.label, f.meaning)
        with VerticalScroll(id="help"):
            yield Static(Text("Keys", style="bold"))
            yield Static(keys)
            yield Static(Text("\nWhat the numbers mean", style="bold"))
            yield Static(glossary)
            yield Static(Text(
                "\nBars: allocated ≤ active ≤ resident are stacked only when they nest; mapped "
                "and retained are address space, drawn as their own bars, never inside "
                "resident.  Unknown values are shown as 'unknown' (or '-'), never as 0.  The "
                "history overlays each series as an area from zero (not stacked).",
                style="dim"))
            yield Static("escape / ? : close", classes="hint")

    def action_close(self):
        self.dismiss(None)


_HIDDEN_ACTIONS = {"copy_text", "screen.copy_text", "app.copy_text", "command_palette"}


def binding_help(*owners):
    """(keys, description) of the bindings of OWNERS (screen, app) that apply now."""
    order, keys = [], {}
    for owner in owners:
        for bindings in owner._bindings.key_to_bindings.values():
            for binding in bindings:
                if not binding.description or binding.action in _HIDDEN_ACTIONS:
                    continue
                try:
                    ok = owner.check_action(binding.action.split("(")[0], ())
                except Exception:
                    ok = True
                if ok is False:
                    continue
                ident = (binding.action, binding.description)
                if ident not in keys:
                    order.append(ident)
                    keys[ident] = []
                shown = owner.app.get_key_display(binding)
                if shown not in keys[ident]:
                    keys[ident].append(shown)
    return [(", ".join(keys[i]), i[1]) for i in order]


# -- host view ---------------------------------------------------------------------

