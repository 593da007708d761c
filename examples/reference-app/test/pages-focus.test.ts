// The provider's sign-out and switch-account pages act on a button press. A hostile page can open
// them in a new tab (framing is refused) while the user is typing or playing there: a button that
// takes the focus on its own would then be pressed by the next Enter or Space meant for that page.
import { expect, it } from 'vitest';
import { logoutPage, switchAccountPage } from '../src/idp/pages.js';

// Was wrong: "Yes, sign me out" and "Continue as <name>" were `autofocus` buttons.
it('no button of the sign-out and switch-account pages takes the focus on its own', () => {
  const form = '<form id="op.logoutForm" method="post" action="/session/end/confirm"></form>';
  expect(logoutPage({ form, clientName: 'Photo app' })).not.toMatch(/<button[^>]*autofocus/);
  expect(
    switchAccountPage({
      action: '/session/end/confirm',
      xsrf: 't',
      currentName: 'Alice',
      nextName: 'Bob',
      clientName: 'Photo app',
    }),
  ).not.toMatch(/<button[^>]*autofocus/);
});
